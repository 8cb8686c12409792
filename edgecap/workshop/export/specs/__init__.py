"""Export specs of the built-in model families, one module each; a family names its builder in its
``FamilyHooks(export_spec="edgecap.workshop.export.specs.<module>:<builder>")``, so nothing here needs registering.
"""

from edgecap.workshop.export.specs.captioning import captioning_spec

__all__ = ["captioning_spec"]
