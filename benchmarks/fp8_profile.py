"""Where an fp8 step's time goes on a GPU: kernels by name, per step.

    python -m benchmarks.fp8_profile [--model mlp] [--variants bf16,fp8]
                                     [--steps 5] [--out DIR] [--smoke]

For each variant of benchmarks/fp8_gpu.py (the same models, weights and
steps: xla_amp.torchax.make_train_step, policy tpu), one process compiles the
step, runs 3 steps, then traces --steps more under jax.profiler and sums the
device's events by kernel name (jax.profiler.ProfileData over the trace's
xplane). It writes DIR/fp8_profile.json (every kernel: calls and ms per
step), DIR/fp8_profile.md (the top 25 per variant and the total by kind:
GEMMs, fusions, copies/transposes, other) and DIR/<variant>_optimized.hlo.gz
(the optimized program, to read which fusion a kernel is). Each fusion
kernel's row also gives the bytes at its boundary (its operands and results,
read from that program) and the bandwidth that makes per call: how far a
memory-bound kernel is from the card's. Each variant also sums its time by
`role` (GEMMs, quantizations, reductions, casts, ...) and counts the fusions
with a buried reduction (`buried_reductions`) and the traced time of those
among its kernels. On XLA:CPU (--smoke) the "device"
is the host's XLA ops: a check of the script. ``--report DIR`` rewrites
DIR/fp8_profile.md from a run's saved files.
"""
from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile

from benchmarks import _harness as H
from benchmarks import fp8_gpu


def kind(name: str) -> str:
    n = name.lower()
    if any(k in n for k in ("gemm", "cublas", "matmul", "sm90_xmma", "cutlass", "nvjet")):
        return "gemm"
    if "transpose" in n or "copy" in n:
        return "copy/transpose"
    if "fusion" in n or "reduce" in n or "loop_" in n or "input_" in n:
        return "fusion"
    return "other"


def kernel_name(name: str) -> str:
    """A fusion's or kernel's name as the GPU profile gives it: "." as "_"
    (``input_reduce_fusion.3`` runs as ``input_reduce_fusion_3``; XLA:CPU
    keeps the ".")."""
    return name.replace(".", "_")


def role(name: str, typ: str) -> str:
    """What a kernel does in an fp8 or bf16 step, from its name and its
    fusion's result type in the optimized program ("" if not a fusion):
    quantizations by their float8 results, the history's concatenates,
    reductions that also write elementwise results (AdamW's update, GELU's
    backward, with amax stages fused in), other reductions, casts."""
    if kind(name) == "gemm":
        return "GEMM"
    layouts = typ.count("f8e")
    if layouts:
        return "quantize, both layouts" if layouts > 1 else "quantize"
    if "concatenate" in name:
        return "amax history / stacks"
    if "reduce" in name:
        return "reduction with outputs" if typ.startswith("(") else "reduction"
    if "convert" in name:
        return "cast"
    return "other fusion" if kind(name) == "fusion" else "other"


_BYTES = {"f64": 8, "s64": 8, "u64": 8, "f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2,
          "s16": 2, "u16": 2, "s8": 1, "u8": 1, "pred": 1}
_ARRAY = re.compile(r"(\w+)\[([\d,]*)\]")


def nbytes(typ: str) -> int:
    """Bytes of an HLO type, an array or a tuple of them ("f8e4m3fn[4,8]": 32)."""
    total = 0
    for elem, dims in _ARRAY.findall(typ):
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += n * _BYTES.get(elem, 1 if elem.startswith("f8") else 4)
    return total


def fusion_bytes(hlo: str) -> dict[str, int]:
    """{kernel name: bytes of the fusion's operands and results} over an
    optimized program's fusions. A kernel is named after its fusion
    (kernel_name). An operand the fusion reads only in part (a slice) counts whole."""
    from tests.support.fp8 import parse
    instrs = parse(hlo)
    return {kernel_name(name): nbytes(typ) + sum(nbytes(instrs[o][0])
                                                     for o in operands if o in instrs)
            for name, (typ, opcode, operands, _) in instrs.items() if opcode == "fusion"}


def buried_reductions(hlo: str) -> dict[str, list[str]]:
    """{kernel name: the types its buried reductions read} over an optimized
    program's fusions. A reduce is buried when no output of its fusion (the
    ROOT, or each element of a ROOT tuple) has its shape: not a reduction
    fusion's result (nor its elementwise epilogue's) but an elemental
    producer of something else. E.g. the last stage of an amax inside delayed
    scaling's history concatenate, where one thread may reduce it serially
    (seen in an H100 profile; xla_amp.fp8._quant.pinned_amax, the default, takes
    them out: none on an H200)."""
    from tests.support.fp8 import computations
    comps = computations(hlo)
    instrs = {n: i for _, body in comps.values() for n, i in body.items()}
    out = {}
    for name, (_, opcode, _, attrs) in instrs.items():
        called = re.search(r"calls=%?([\w.\-]+)", attrs) if opcode == "fusion" else None
        if called is None or called.group(1) not in comps:
            continue
        root, body = comps[called.group(1)]
        written = body[root][2] if body[root][1] == "tuple" else [root]
        shapes = {_dims(body[w][0]) for w in written if w in body}
        reads = [body[i[2][0]][0].split("{")[0] for i in body.values()
                 if i[1] == "reduce" and _dims(i[0]) not in shapes and i[2][0] in body]
        if reads:
            out[kernel_name(name)] = reads
    return out


def _dims(typ: str) -> str:
    """The dimensions of an array type ("bf16[8192]{0}": "8192")."""
    m = _ARRAY.search(typ)
    return m.group(2) if m else typ


def with_traffic(kernels: dict, traffic: dict) -> None:
    """Adds "bytes" to each kernel row that is a fusion of `traffic`
    (fusion_bytes; XLA:CPU names its kernels with the ".")."""
    for n, row in kernels.items():
        if kernel_name(n) in traffic:
            row["bytes"] = traffic[kernel_name(n)]


def device_events(xplane: str) -> tuple[dict, dict]:
    """({kernel name: [calls, total ns]} over the device planes of one trace,
    {"plane / line": events} of every line read or skipped: what to adjust
    if a backend names its lines otherwise)."""
    import jax
    data = jax.profiler.ProfileData.from_file(xplane)
    planes = [p for p in data.planes if p.name.startswith("/device:")]
    if not planes:  # XLA:CPU: the host plane's XLA ops
        planes = [p for p in data.planes if p.name.startswith("/host:")]
    out = collections.defaultdict(lambda: [0, 0.0])
    lines = {}
    for plane in planes:
        for line in plane.lines:
            events = list(line.events)
            lines[f"{plane.name} / {line.name}"] = len(events)
            if plane.name.startswith("/device:") and "stream" not in line.name.lower() \
                    and "kernel" not in line.name.lower():
                continue  # XLA op / module lines repeat the kernels' time
            if line.name == "python":
                continue  # the host's Python calls (XLA:CPU's trace)
            for ev in events:
                out[ev.name][0] += 1
                out[ev.name][1] += ev.duration_ns
    return dict(out), lines


def profile(model: str, variant: str, args) -> dict:
    import jax
    v = fp8_gpu.TorchaxVariant(model, variant, args)
    v.compile()
    with fp8_gpu.pinning(variant):
        hlo = v.step.lower(*v.batches[0]).compile().as_text()
    with gzip.open(os.path.join(args.out, f"{variant}_optimized.hlo.gz"), "wt") as f:
        f.write(hlo)
    v.run(3)
    v.wait()
    with tempfile.TemporaryDirectory() as d:
        jax.profiler.start_trace(d)
        v.run(args.steps)
        v.wait()
        jax.profiler.stop_trace()
        traces = glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True)
        events, lines = device_events(traces[0])
    per_step = {n: {"calls": c / args.steps, "ms": ns / 1e6 / args.steps}
                for n, (c, ns) in sorted(events.items(), key=lambda kv: -kv[1][1])}
    out = {"kernels": per_step, "lines": lines}
    summarize(out, hlo)
    return out


def summarize(r: dict, hlo: str) -> None:
    """A variant's profile `r` ({"kernels": ...}) summed and read against its
    optimized program: ms per step by `kind` and by `role`, the total, each
    fusion kernel's bytes, the buried reductions (--report redoes this)."""
    from tests.support.fp8 import parse
    with_traffic(r["kernels"], fusion_bytes(hlo))
    types = {kernel_name(n): t for n, (t, _, _, _) in parse(hlo).items()}
    kinds, roles = collections.Counter(), collections.Counter()
    for n, k in r["kernels"].items():
        kinds[kind(n)] += k["ms"]
        roles[role(n, types.get(kernel_name(n), ""))] += k["ms"]
    r.update(by_kind_ms=dict(kinds), by_role_ms=dict(roles), total_ms=sum(kinds.values()),
             buried=buried_reductions(hlo))


def report(results: dict) -> str:
    rows = []
    for variant, r in results.items():
        rows += [f"### {variant}: {r['total_ms']:.2f} ms of kernels per step", "",
                 "| kind | ms/step |", "|---|---|"]
        rows += [f"| {k} | {ms:.2f} |" for k, ms in sorted(r["by_kind_ms"].items())]
        rows += ["", "| role | ms/step |", "|---|---|"]
        rows += [f"| {k} | {ms:.2f} |" for k, ms in sorted(r.get("by_role_ms", {}).items(),
                                                            key=lambda kv: -kv[1])]
        rows += ["", "| kernel | calls/step | ms/step | MB/call | GB/s |", "|---|---|---|---|---|"]
        rows += [f"| `{n[:90]}` | {k['calls']:.1f} | {k['ms']:.3f} | {_traffic(k)} |"
                 for n, k in list(r["kernels"].items())[:25]]
        rows += ["", _buried_line(r), ""]
    return "\n".join(rows)


def _buried_line(r: dict) -> str:
    buried = r.get("buried", {})
    hit = [k for n, k in r["kernels"].items() if kernel_name(n) in buried]
    return (f"Fusions with a buried reduction (buried_reductions): {len(buried)} in the "
            f"program ({', '.join(sorted({t for ts in buried.values() for t in ts}))}); "
            f"traced kernels among them {sum(k['calls'] for k in hit):.0f} a step, "
            f"{sum(k['ms'] for k in hit):.3f} ms.")


def _traffic(kernel: dict) -> str:
    if "bytes" not in kernel or not kernel["ms"]:
        return " | "
    per_call_s = kernel["ms"] / 1e3 / kernel["calls"]
    mb = kernel["bytes"] / 1e6
    return f"{mb:.{1 if mb >= 0.1 else 4}f} | {kernel['bytes'] / per_call_s / 1e9:.0f}"


def rereport(out: str) -> None:
    """DIR/fp8_profile.md again from DIR's fp8_profile.json and optimized
    programs (a run from before the traffic columns included)."""
    with open(os.path.join(out, "fp8_profile.json")) as f:
        results = json.load(f)
    for variant, r in results.items():
        with gzip.open(os.path.join(out, f"{variant}_optimized.hlo.gz"), "rt") as f:
            summarize(r, f.read())
    with open(os.path.join(out, "fp8_profile.md"), "w") as f:
        f.write(report(results))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--variants", default="bf16,fp8")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--out", default=os.environ.get("OUT") or "build")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--worker", default="", help="VARIANT (internal)")
    ap.add_argument("--report", default="", metavar="DIR",
                    help="rewrite DIR/fp8_profile.md from DIR's saved run, then stop")
    args = ap.parse_args(argv)
    if args.report:
        rereport(args.report)
        return
    os.makedirs(args.out, exist_ok=True)
    if args.worker:
        H.print_result(profile(args.model, args.worker, args))
        return
    results = {}
    common = ["--model", args.model, "--steps", str(args.steps), "--lr", str(args.lr),
              "--out", args.out] + (["--smoke"] if args.smoke else [])
    for variant in args.variants.split(","):  # one process each: one trace each
        results[variant] = H.run_worker("benchmarks.fp8_profile", ["--worker", variant, *common],
                                        variant, stream_stderr=True)
        print(variant, f"{results[variant]['total_ms']:.2f} ms", json.dumps(
            results[variant]["by_kind_ms"]), file=sys.stderr, flush=True)
    H.write_results(args.out, "fp8_profile", results, report(results))


if __name__ == "__main__":
    main()
