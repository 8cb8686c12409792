"""Export specs of the built-in model families; importing this package registers them (``register_export_spec``).

A new family adds one module here that calls :func:`~edgecap.export.spec.register_export_spec` and one import line.
"""

# register the built-in families
from edgecap.export.specs import expansionnet, image_transformer, labert, ort  # noqa: F401
from edgecap.export.specs.captioning import captioning_spec

__all__ = ["captioning_spec"]
