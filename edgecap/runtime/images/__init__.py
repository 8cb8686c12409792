"""Images on the device: safe file loading, the bundle's preprocessing, and the encoder inputs it feeds."""
