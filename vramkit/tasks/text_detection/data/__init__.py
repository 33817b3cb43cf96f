"""Text-detection data: ICDAR 2015 folders and files, annotation checks, the synthetic renderer,
augmentation, DBNet targets, polygon geometry and the datamodule."""
