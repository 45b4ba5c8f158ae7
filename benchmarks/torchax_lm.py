"""A GPT-2-shaped LM's training step three ways: xla_amp on
torch_xla, xla_amp on torchax and plain JAX, side by side in one run.

    PJRT_DEVICE=CPU .venv/bin/python benchmarks/torchax_lm.py [--gpt2] [--rounds 20]

The model, written once below as an nn.Module (GPT-2's: wte + wpe, pre-LN
blocks with causal F.scaled_dot_product_attention and a tanh-GELU MLP, ln_f,
head tied to wte unless --untied), is 2 layers x 256, 4 heads, vocab 1024,
seq 128, batch 8 by default; --gpt2: GPT-2 small (12 x 768, 12 heads, vocab
50257). Every path starts from the same weights (GPT-2's init, seed 0) and
trains AdamW (lr 1e-3, weight decay 0.01) on the same --num-batches batches
of random tokens (cycled):

  torch_xla  xla_amp.autocast(device, policy="tpu") (bf16) around forward +
             loss; backward; xla_amp.syncfree.AdamW (--torch-optim torch:
             torch.optim.AdamW); torch_xla.sync()
  torchax    xla_amp.torchax.make_train_step(model, loss, optax.adamw,
             policy="tpu"): one jax.jit step, no loss scaler (bf16)
  jax        the model's twin in jax.numpy, one jax.jit step, with the casts
             the tpu policy makes written by hand: linear inputs (weight and
             bias too) bf16, attention scores bf16, softmax, layer norm and
             the loss float32, GELU on the bf16 linear output, residuals
             float32 (f32 + bf16 promotes); optax.adamw

Each path's cold first step is timed (trace and compile: torch_xla's
CompileTime/ExecuteTime metrics, JAX's monitoring events), --warmup steps
build every other graph, then --rounds interleaved rounds (each led by
another path) of --steps steps: ms/step is the median over rounds, a ratio
the median of per-round ratios, printed with their quartiles and range
(the verdict on the 5 % goal needs --rounds 20 or more). Executions/step:
torch_xla's ExecuteTime count; JAX has none, so the JAX paths check for
traces and compiles after warm-up and run under jax.transfer_guard(
"disallow"): one jit call, one execution. The HLO of both JAX steps is
counted by opcode, converts and selects by source (_hlo.py); --hlo-dir
writes both programs' lowered and optimized text there.
(This file was benchmarks/torchax.py: run as a script, any file of this
folder put that name ahead of the torchax package on sys.path;
tests/suite/test_module_names.py keeps such names out.)
"""
from __future__ import annotations

import argparse, collections, copy, json, math, os, statistics, subprocess, time  # noqa: E401

os.environ.setdefault("PJRT_DEVICE", "CPU")
if os.environ["PJRT_DEVICE"] == "CPU":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla.debug.metrics as met  # noqa: E402

import xla_amp  # noqa: E402
import xla_amp.torchax as xt  # noqa: E402
from benchmarks import _harness as H, _hlo  # noqa: E402  (the checkout is importable)
from tests.support.gpt_model import GPT, lm_loss  # noqa: E402

PATHS = ("torch_xla", "torchax", "jax")
LABELS = {"torch_xla": "xla_amp on torch_xla (autocast tpu, bf16)",
          "torchax": "xla_amp on torchax (make_train_step, tpu)",
          "jax": "plain JAX (hand-written bf16 jit step)"}
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 0.01  # AdamW, every path
BF16, F32 = jnp.bfloat16, jnp.float32
JAX_EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace",
              "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
              "/jax/core/compile/backend_compile_duration": "compile"}
GOAL, GOAL_ROUNDS = 1.05, 20  # torchax within 5 % of plain JAX, over >= 20 rounds


# ----------------------------------------------------------------- the model


# ------------------------------------------------------- its plain-JAX twin


def _linear(x, w, b=None):  # the policy's linear: inputs (bias too) bf16, bf16 out
    y = x.astype(BF16) @ w.astype(BF16).T
    return y if b is None else y + b.astype(BF16)


def _layer_norm(x, w, b, eps=1e-5):  # float32 (its input, the residual, is float32)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + eps) * w + b


def jax_forward(p, idx, heads: int, layers: int):
    B, T = idx.shape
    x = p["wte.weight"][idx] + p["wpe.weight"][:T]
    causal = jnp.tril(jnp.ones((T, T), bool))
    for i in range(layers):
        g = lambda n: p[f"blocks.{i}.{n}"]  # noqa: E731
        C = x.shape[-1]
        qkv = _linear(_layer_norm(x, g("ln_1.weight"), g("ln_1.bias")),
                      g("c_attn.weight"), g("c_attn.bias"))
        q, k, v = (t.reshape(B, T, heads, C // heads).transpose(0, 2, 1, 3)
                   for t in jnp.split(qkv, 3, axis=-1))
        s = (q @ k.swapaxes(-1, -2)) * (1.0 / math.sqrt(C // heads))  # bf16
        s = jnp.where(causal, s, -jnp.inf)
        a = jax.nn.softmax(s.astype(F32), axis=-1).astype(BF16)  # softmax in float32
        y = (a @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + _linear(y, g("c_proj.weight"), g("c_proj.bias"))  # f32 + bf16 -> f32
        h = _linear(_layer_norm(x, g("ln_2.weight"), g("ln_2.bias")),
                    g("c_fc.weight"), g("c_fc.bias"))
        x = x + _linear(jax.nn.gelu(h, approximate=True), g("mlp_proj.weight"),
                        g("mlp_proj.bias"))
    x = _layer_norm(x, p["ln_f.weight"], p["ln_f.bias"])
    return _linear(x, p.get("head.weight", p["wte.weight"]))


def jax_train_step(model: GPT, opt):
    heads, layers = model.blocks[0].heads, len(model.blocks)

    def loss_fn(params, idx, target):
        logp = jax.nn.log_softmax(jax_forward(params, idx, heads, layers).astype(F32), axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, target[..., None], axis=-1))

    def train_step(params, opt_state, idx, target):
        loss, grads = jax.value_and_grad(loss_fn)(params, idx, target)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(train_step)


# ------------------------------------------------------------------ the paths


class Compiles:
    """Per path and phase: JAX's trace/lower/compile events, XLA's metrics."""

    def __init__(self):
        self.at, self.seen = None, collections.defaultdict(collections.Counter)
        jax.monitoring.register_event_duration_secs_listener(self._jax)

    def _jax(self, event, secs, **kw):
        if self.at and event in JAX_EVENTS:
            self.seen[self.at][JAX_EVENTS[event] + "_ms"] += secs * 1e3
            self.seen[self.at][JAX_EVENTS[event] + "s"] += 1

    def phase(self, path, phase, fn):
        self.at, c = (path.name, phase), self.seen[(path.name, phase)]
        xla = lambda: {k[:-4].lower(): (met.metric_data(k) or (0, 0.0))[:2]  # noqa: E731
                       for k in ("CompileTime", "ExecuteTime")}
        m0 = xla()
        try:
            return fn()
        finally:
            path.wait()
            self.at = None
            if path.name == "torch_xla":  # (its traces are not counted)
                for k, (n, ns) in xla().items():
                    c[k + "s"] += n - m0[k][0]
                    c[k + "_ms"] += (ns - m0[k][1]) / 1e6


class Path:
    """One compared training loop: ``step()`` runs a step, ``wait()`` waits
    for the device, ``loss`` is the last step's loss."""

    def __init__(self, name, model, batches, args):
        self.name, self.i, self.tally = name, 0, H.Tally()
        t0 = time.perf_counter()
        if name == "torch_xla":
            self.dev = torch_xla.device()
            self.model = copy.deepcopy(model).to(self.dev)
            self.batches = [(x.to(self.dev), y.to(self.dev)) for x, y in batches]
            cls = xla_amp.syncfree.AdamW if args.torch_optim == "syncfree" else torch.optim.AdamW
            self.opt = cls(self.model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
            self.wait = H.wait_device
        else:
            self.batches = [tuple(jnp.asarray(t.numpy()) for t in b) for b in batches]
            opt = optax.adamw(LR, *BETAS, EPS, weight_decay=WD)
            if name == "torchax":
                self.train = xt.make_train_step(copy.deepcopy(model), lm_loss, opt, policy="tpu")
                self.wait = lambda: jax.block_until_ready(self.train.state)
            else:
                params = {k: jnp.asarray(v.detach().numpy())
                          for k, v in model.state_dict().items()}
                self.state, self.jitted = [params, opt.init(params)], jax_train_step(model, opt)
                self.wait = lambda: jax.block_until_ready(self.state)
        self.build_ms = (time.perf_counter() - t0) * 1e3

    def step(self):
        x, y = self.batches[self.i % len(self.batches)]
        self.i += 1
        if self.name == "torch_xla":
            self.opt.zero_grad(set_to_none=True)
            with xla_amp.autocast(self.dev, policy="tpu"):
                loss = lm_loss(self.model(x), y)
            loss.backward()
            self.opt.step()
            torch_xla.sync()
            self.loss = loss.detach()
        elif self.name == "torchax":
            self.loss = self.train(x, y)
        else:
            self.state[0], self.state[1], self.loss = self.jitted(*self.state, x, y)

    def measure(self, n):
        if self.name == "torch_xla":
            return self.tally.measure(self.step, n)
        with jax.transfer_guard("disallow"):
            ms = H.time_steps(self.step, n, wait=self.wait)
        self.tally.ms.append(ms)
        self.tally.steps += n
        return ms

    def lowered(self):
        b = self.batches[0]
        return self.train.lower(*b) if self.name == "torchax" else \
            self.jitted.lower(*self.state, *b)


# -------------------------------------------------------------------- driver


def run(args) -> dict:
    torch.manual_seed(0)
    model = GPT(args.vocab, args.seq, args.embd, args.heads, args.layers, not args.untied)
    g = torch.Generator().manual_seed(0)
    batches = [tuple(torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
                     for _ in "xy") for _ in range(args.num_batches)]
    log, paths = Compiles(), []
    for name in args.paths.split(","):  # build, then the cold first step
        p = Path(name, model, batches, args)
        t0 = time.perf_counter()
        log.phase(p, "first", p.step)
        p.first_ms, p.first_loss = (time.perf_counter() - t0) * 1e3, float(p.loss)
        paths.append(p)
        print(f"{name}: built in {p.build_ms:.0f} ms, first step {p.first_ms:.0f} ms", flush=True)
    for p in paths:  # every other graph, before any timing
        log.phase(p, "warmup", lambda: H.warm_up([p.step], args.warmup, wait=p.wait))

    def one(p, r):
        ms = log.phase(p, "timed", lambda: p.measure(args.steps))
        print(f"round {r + 1}/{args.rounds} {p.name:9s} {ms:.1f} ms/step", flush=True)
    H.interleaved(paths, args.rounds, one)
    out = {"config": {k: v for k, v in vars(args).items() if k != "json"}, "paths": {}}
    by = {p.name: p for p in paths}
    for p in paths:
        t = p.tally
        out["paths"][p.name] = dict(
            {ph: dict(log.seen[(p.name, ph)]) for ph in ("first", "warmup", "timed")},
            build_ms=p.build_ms, first_ms=p.first_ms, first_loss=p.first_loss,
            loss=float(p.loss), ms=t.ms, median_ms=H.median(t.ms),
            executions=t.per_step("ExecuteTime") if p.name == "torch_xla" else None,
            transfers=t.per_step("TransferFromDeviceTime") if p.name == "torch_xla" else 0,
            **{f"vs_{q}": H.paired_ratio(t.ms, by[q].tally.ms) for q in by},
            **{f"ratios_vs_{q}": [x / y for x, y in zip(t.ms, by[q].tally.ms)] for q in by})
    if "torchax" in by and "jax" in by:
        out["hlo"] = {}
        for n in ("torchax", "jax"):
            lowered = by[n].lowered()
            texts = {"lowered": lowered.as_text(), "hlo": lowered.compile().as_text()}
            out["hlo"][n] = _hlo.summary(texts["lowered"], texts["hlo"])
            if args.hlo_dir:
                for kind, text in texts.items():
                    with open(os.path.join(args.hlo_dir, f"{n}.{kind}.txt"), "w") as f:
                        f.write(text)
    return out


def spread(ratios) -> str:
    """Quartiles and range of per-round ratios."""
    q = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    return f"quartiles {q[0]:.3f}-{q[2]:.3f}, range {min(ratios):.3f}-{max(ratios):.3f}"


def report(out: dict) -> str:
    c = out["config"]
    lines = [f"GPT-2-shaped LM, {c['layers']} layers x {c['embd']}, {c['heads']} heads, vocab "
             f"{c['vocab']}, seq {c['seq']}, batch {c['batch']}, AdamW, tpu policy (bf16); "
             f"{c['rounds']} rounds x {c['steps']} steps after {c['warmup']} warm-up steps; "
             f"{jax.default_backend()} ({os.cpu_count()} cores), torch {torch.__version__}, "
             f"torch_xla {torch_xla.__version__}, jax {jax.__version__}; commit "
             f"{out['commit']}", "", H.md_header(
                 ["path", "ms/step (median)", "vs plain JAX", "spread of its rounds",
                  "vs torch_xla", "executions/step",
                  "host transfers/step", "first step ms", "of it trace+lower ms",
                  "of it XLA compile ms", "compiles first / warm-up / timed",
                  "loss first / last"])]
    for name, r in out["paths"].items():
        first = r["first"]
        if name == "torch_xla":  # what is neither compile nor execution
            trace = f"≈{r['first_ms'] - first['compile_ms'] - first['execute_ms']:.0f}"
        else:
            trace = f"{first.get('trace_ms', 0) + first.get('lower_ms', 0):.0f}"
        ratio = lambda q, f: f.format(r[f"vs_{q}"]) if f"vs_{q}" in r else "-"  # noqa: E731
        lines.append(H.md_row([
            LABELS[name], f"{r['median_ms']:.1f}", ratio("jax", "{:.3f}x"),
            spread(r["ratios_vs_jax"]) if "ratios_vs_jax" in r and name != "jax" else "-",
            ratio("torch_xla", "{:.2f}x"),
            "1 (a jit call)" if r["executions"] is None else f"{r['executions']:.2f}",
            f"{r['transfers']:.2f}", f"{r['first_ms']:.0f}", trace,
            f"{first['compile_ms']:.0f}",
            " / ".join(str(r[ph].get("compiles", 0)) for ph in ("first", "warmup", "timed")),
            f"{r['first_loss']:.4f} / {r['loss']:.4f}"]))
    if "hlo" in out:
        lines += _hlo.section(out["hlo"])
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    for flag, default in (("layers", 2), ("embd", 256), ("heads", 4), ("vocab", 1024),
                          ("seq", 128), ("batch", 8), ("steps", 3), ("rounds", 20),
                          ("warmup", 3), ("num-batches", 4)):  # (the docstring says which)
        ap.add_argument(f"--{flag}", type=int, default=default)
    ap.add_argument("--gpt2", action="store_true",
                    help="GPT-2 small: 12 layers x 768, 12 heads, vocab 50257")
    ap.add_argument("--untied", action="store_true", help="a head of its own")
    ap.add_argument("--torch-optim", choices=["syncfree", "torch"], default="syncfree",
                    help="torch_xla's AdamW: xla_amp.syncfree.AdamW or torch.optim.AdamW")
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--hlo-dir", default=None,
                    help="write both JAX steps' lowered and optimized HLO text here")
    args = ap.parse_args(argv)
    if args.gpt2:
        args.layers, args.embd, args.heads, args.vocab = 12, 768, 12, 50257
    if args.embd % args.heads or args.warmup < 2:
        ap.error("--embd must divide by --heads; --warmup must be at least 2")
    if any(p not in PATHS for p in args.paths.split(",")):
        ap.error(f"--paths: a comma-separated subset of {','.join(PATHS)}")
    if args.rounds < 1 or args.steps < 1:
        ap.error("--rounds and --steps must be at least 1")
    if args.hlo_dir:
        os.makedirs(args.hlo_dir, exist_ok=True)
    t0, out = time.time(), run(args)
    out["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                   text=True, cwd=os.path.dirname(__file__)).stdout.strip()
    print("\n" + report(out))
    if "torchax" in out["paths"] and "jax" in out["paths"]:
        r = out["paths"]["torchax"]
        verdict = (f"fewer than {GOAL_ROUNDS} rounds: no verdict" if args.rounds < GOAL_ROUNDS
                   else "within the 5 % goal" if r["vs_jax"] <= GOAL else "OUTSIDE the 5 % goal")
        print(f"\nxla_amp on torchax vs plain JAX: {r['vs_jax']:.3f}x, median of "
              f"{args.rounds} rounds ({spread(r['ratios_vs_jax'])}; {verdict})")
    if args.json:
        json.dump(out, open(args.json, "w"), indent=1)
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
