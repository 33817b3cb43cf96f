"""DBNet text detection: network, targets, loss, post-processing, the ICDAR 2015 format and
evaluation, datasets, the LightningModule and its submission writer."""

import os

# albumentations asks PyPI for its latest version on every import (albumentations/__init__.py,
# `check_for_updates`, an HTTPS request with a 2 s timeout) unless this is set: a run, a plan
# and every DataLoader worker would reach the network, and wait on a machine without one.
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
