"""ARC grids as tokens, the outputs of grid networks, grid augmentation, and the losses and metrics
of predicted grids."""
