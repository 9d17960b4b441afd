"""The round as the papers' public code does it: a deepcopy of the global model per client, a DataLoader over PIL
images with torchvision transforms, state-dict averaging."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Subset

from .floors import local_steps, sgd


class PILImages(Dataset):
    """Samples as PIL images through torchvision transforms, the way the papers' code loads data."""

    def __init__(self, x, y, transform):
        self.x, self.y, self.transform = x, y, transform

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        img = self.x[i].permute(1, 2, 0).numpy()
        img = Image.fromarray(img[:, :, 0] if img.shape[2] == 1 else img)
        return self.transform(img), int(self.y[i])


class PaperStyle:
    """The round as the papers' public code writes it: per client a deepcopy of the global model and a
    DataLoader over PIL images; gradients or models averaged through state dicts."""

    def __init__(self, cfg, setup):
        from torchvision import transforms as T

        ds, self.device = setup.ds, setup.device
        aug = [T.RandomCrop(ds.x_train.shape[-1], padding=4), T.RandomHorizontalFlip()] if cfg.dataset.augment else []
        images = PILImages(ds.x_train, ds.y_train, T.Compose([*aug, T.ToTensor(), T.Normalize(ds.mean, ds.std)]))
        self.subsets = [Subset(images, p.tolist()) for p in setup.parts]
        self.loaders: dict = {}
        self.model = instantiate(cfg.model, in_shape=tuple(ds.x_train.shape[1:]), num_classes=ds.num_classes)
        self.model.to(self.device).train()
        self.cfg, self.step, self.clip = cfg, local_steps(cfg), cfg.algo.get("clip")

    def _batch(self, i: int, size: int):
        key = (i, size)
        if key not in self.loaders:
            self.loaders[key] = [DataLoader(self.subsets[i], batch_size=size, shuffle=True, drop_last=True), None]
        entry = self.loaders[key]
        try:
            xb, yb = next(entry[1])
        except (StopIteration, TypeError):
            entry[1] = iter(entry[0])
            xb, yb = next(entry[1])
        return xb.to(self.device), yb.to(self.device)

    def __call__(self, log):
        work: dict[int, list[tuple[str, int]]] = {}          # client -> its steps (kind, batch size)
        for kind, ids, batches in log:
            for i, pieces in zip(ids, batches, strict=True):
                work.setdefault(i, []).extend((kind, len(p[1])) for p in pieces if len(p[1]))
        states = []
        for i, steps in work.items():
            local = copy.deepcopy(self.model)
            opt = sgd(self.cfg, local.parameters())
            for kind, size in steps:
                xb, yb = self._batch(i, size)
                opt.zero_grad(set_to_none=True)
                if kind == "clip":                           # per-sample gradients, one sample at a time
                    total = [torch.zeros_like(p) for p in local.parameters()]
                    for s in range(size):
                        grads = torch.autograd.grad(F.cross_entropy(local(xb[s:s + 1]), yb[s:s + 1]),
                                                    list(local.parameters()))
                        scale = min(1.0, self.clip / (torch.sqrt(sum((g ** 2).sum() for g in grads)) + 1e-12))
                        for t, g in zip(total, grads, strict=True):
                            t.add_(g, alpha=float(scale))
                    for p, t in zip(local.parameters(), total, strict=True):
                        p.grad = t / size
                else:
                    F.cross_entropy(local(xb), yb).backward()
                if self.step:
                    opt.step()
            states.append(local.state_dict())
        avg = {k: torch.stack([s[k].float() for s in states]).mean(0).to(v.dtype)
               for k, v in self.model.state_dict().items()}
        self.model.load_state_dict(avg)
