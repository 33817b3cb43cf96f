"""The DBNet network (backbone, FPN neck, DB head), its training loss and its post-processing from
probability map to boxes."""
