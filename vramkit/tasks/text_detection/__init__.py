"""DBNet text detection: network, targets, loss, post-processing, the ICDAR 2015 format and
evaluation, datasets, the LightningModule and its submission writer."""
