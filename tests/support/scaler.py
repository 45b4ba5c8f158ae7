"""Shared by the GradScaler tests: a small model, its data, a training loop
driven by a finite/overflow pattern, and a resume from a checkpoint."""
import torch
import torch_xla

from xla_amp import GradScaler, syncfree

# finite (F) / overflow (O) pattern; growth_interval=3 makes the scale grow too
PATTERN = "FFFFOFFFFFFOOFFFFFFF"
INF = float("inf")


def _make(device, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(),
                               torch.nn.Linear(3, 1)).to(device)


def _data(n=len(PATTERN), seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)) for _ in range(n)]


def _train(model, opt, scaler, device, pattern=PATTERN, data=None, clip=None,
           sync=True, start=0):
    """One scaler iteration per pattern letter; 'O' feeds an inf input."""
    data = data or _data()
    scales = []
    for i, c in enumerate(pattern, start):
        x, y = data[i]
        x = x.to(device) * (INF if c == "O" else 1.0)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y.to(device))
        scaler.scale(loss).backward()
        if clip is not None:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        scaler.step(opt)
        scaler.update()
        if sync and device.type == "xla":
            torch_xla.sync()
        scales.append(scaler.get_scale() if sync else None)
    return scales


def _restore(device, ckpt, seed):
    """A fresh model (other init), syncfree.Adam and GradScaler loaded from a
    {"model", "opt", "scaler"} checkpoint: what a resumed job builds."""
    model = _make(device, seed=seed)
    model.load_state_dict(ckpt["model"])
    opt = syncfree.Adam(model.parameters(), lr=0.01)
    opt.load_state_dict(ckpt["opt"])
    scaler = GradScaler()
    scaler.load_state_dict(ckpt["scaler"])
    return model, opt, scaler
