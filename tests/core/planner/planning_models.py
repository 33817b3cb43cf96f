"""Small models and datamodules the planner tests plan (importable by `_target_`)."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

IMAGE_SIDE = 32
CLASSES = 10


class _Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.norm = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.norm(self.conv(x))) + x


class TinyConvClassifier(L.LightningModule):
    """Residual conv blocks and a classifier; validation counts correct answers on the host."""

    def __init__(self, optimizer: Any, channels: int = 32, blocks: int = 3) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.blocks = nn.Sequential(*[_Block(channels) for _ in range(blocks)])
        self.head = nn.Linear(channels, CLASSES)
        self.optimizer_factory = optimizer
        self.correct = 0

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.blocks(F.relu(self.stem(images)))
        return self.head(features.mean(dim=(2, 3)))

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = F.cross_entropy(self(batch["image"]), batch["label"])
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        predicted = self(batch["image"]).argmax(dim=1).cpu().numpy()
        self.correct += int((predicted == batch["label"].cpu().numpy()).sum())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.optimizer_factory(params=self.parameters())


class PatchEmbeddingEncoder(L.LightningModule):
    """ViT-like: one stride-`patch` convolution cuts the image into patch tokens, then a
    transformer encoder layer and a classifier over the mean token."""

    def __init__(self, optimizer: Any, patch: int = 16, width: int = 192, heads: int = 3) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, width, patch, stride=patch)
        self.encoder = nn.TransformerEncoderLayer(width, heads, 4 * width, batch_first=True)
        self.head = nn.Linear(width, CLASSES)
        self.optimizer_factory = optimizer

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(images).flatten(2).transpose(1, 2)
        return self.head(self.encoder(tokens).mean(dim=1))

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch["image"]), batch["label"])

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self(batch["image"]).argmax(dim=1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.optimizer_factory(params=self.parameters())


class WideKernelConv(L.LightningModule):
    """One 7x7 convolution from many channels to few: its cuDNN workspace estimate (49 taps per
    input channel, per output position) dwarfs its activations, so the step peaks inside it."""

    def __init__(self, optimizer: Any, channels: int = 32, out_channels: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, out_channels, 7, padding=3)
        self.optimizer_factory = optimizer

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        return self.conv(batch["image"]).square().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.optimizer_factory(params=self.parameters())


class _RandomImages(Dataset):
    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(index)
        return {
            "image": torch.randn(3, IMAGE_SIDE, IMAGE_SIDE, generator=generator),
            "label": torch.tensor(index % CLASSES),
        }


class RandomImageDataModule(L.LightningDataModule):
    """Random 32×32 images with labels; samples are made on demand, so any length is free."""

    def __init__(self, batch_size: int, val_batch_size: int, train_length: int, val_length: int):
        super().__init__()
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size
        self.train_length = train_length
        self.val_length = val_length

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_RandomImages(self.train_length), batch_size=self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(_RandomImages(self.val_length), batch_size=self.val_batch_size)


class PhiClassifier(L.LightningModule):
    """A Hugging Face Phi sequence classifier built from its config alone (no weights)."""

    def __init__(self, config: dict, optimizer: Any) -> None:
        super().__init__()
        from transformers import AutoModelForSequenceClassification, PhiConfig

        self.model = AutoModelForSequenceClassification.from_config(PhiConfig(**config))
        self.optimizer_factory = optimizer
        self.correct = 0

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        return self.model(**batch).loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        labels = batch["labels"]
        logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        self.correct += int((logits.logits.argmax(-1) == labels).sum())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.optimizer_factory(params=self.parameters())


class _RandomTokens(Dataset):
    def __init__(self, length: int, sequence_length: int, vocab_size: int) -> None:
        self.length = length
        self.sequence_length = sequence_length
        self.vocab_size = vocab_size

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(index)
        ids = torch.randint(1, self.vocab_size, (self.sequence_length,), generator=generator)
        return {
            "input_ids": ids,
            "attention_mask": torch.ones(self.sequence_length, dtype=torch.long),
            "labels": torch.tensor(index % 2),
        }


class RandomTokenDataModule(L.LightningDataModule):
    """Random token sequences of a fixed length with binary labels."""

    def __init__(
        self,
        batch_size: int,
        val_batch_size: int,
        sequence_length: int,
        vocab_size: int,
        length: int = 1000,
    ) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size
        self.dataset = _RandomTokens(length, sequence_length, vocab_size)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.dataset, batch_size=self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.dataset, batch_size=self.val_batch_size)


def task_config(model: dict, data: dict, hw: dict, defaults: tuple[int, int] = (8, 8)):
    """A composed-config stand-in: model, data (reading `hw` by interpolation), hw, defaults."""
    from omegaconf import OmegaConf

    data = {
        **data,
        "batch_size": "${hw.batch_size}",
        "val_batch_size": "${hw.val_batch_size}",
    }
    return OmegaConf.create(
        {
            "model": model,
            "data": data,
            "hw": hw,
            "batch_size_defaults": {"train": defaults[0], "val": defaults[1]},
            "trainer": {"max_epochs": 1},
        }
    )


CONV_MODEL = {
    "_target_": "planning_models.TinyConvClassifier",
    "optimizer": {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 1e-3},
}
IMAGE_DATA = {
    "_target_": "planning_models.RandomImageDataModule",
    "train_length": 100_000,
    "val_length": 100_000,
}


class PaddedEncoder(L.LightningModule):
    """A pre-norm `nn.TransformerEncoder` over padded sequences, like the SAGE student."""

    def __init__(
        self, optimizer: Any, width: int = 32, heads: int = 4, layers: int = 2, dropout: float = 0.1
    ) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout=dropout, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, CLASSES)
        self.optimizer_factory = optimizer

    def forward(self, tokens: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(tokens, src_key_padding_mask=padding).mean(dim=1))

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch["tokens"], batch["padding"]), batch["label"])

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self(batch["tokens"], batch["padding"]).argmax(dim=1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.optimizer_factory(params=self.parameters())


class TiedLanguageModel(L.LightningModule):
    """An embedding whose weight the output layer shares (GPT-2, BERT's MLM head), 24 MiB fp32."""

    def __init__(self, optimizer: Any, vocabulary: int = 12288, width: int = 512) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocabulary, width)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocabulary, bias=False)
        self.head.weight = self.embed.weight
        self.optimizer_factory = optimizer

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.embed(tokens)))

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        logits = self(batch["tokens"])
        return F.cross_entropy(logits.flatten(0, 1), batch["tokens"].flatten())

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self(batch["tokens"]).argmax(dim=-1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.optimizer_factory(params=self.parameters())


# A two-layer Phi: the Hugging Face model's code paths at a size a CPU test traces in a second.
TINY_PHI = {
    "vocab_size": 1000,
    "hidden_size": 64,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 128,
    "num_labels": 2,
    "pad_token_id": 0,
}
