"""The GPU benchmarks count an optimized XLA:GPU program's GEMMs from its
text. XLA prints a cuBLAS call with its workspace as a tuple-typed
custom-call, `(bf16[..]{1,0}, s8[..]{0}) custom-call(...)`: the parser must
read those (until the fourteenth session it skipped them, and the H100/H200
tables counted only the Triton GEMM fusions)."""
from benchmarks import fp8_profile, gpu
from tests.support.fp8 import parse

OPTIMIZED = """\
HloModule jit__step, entry_computation_layout={()->()}

%gemm_fusion_dot.1_computation (parameter_0: bf16[64,32], parameter_1: bf16[32,16]) -> bf16[64,16] {
  %parameter_0 = bf16[64,32]{1,0} parameter(0)
  %parameter_1 = bf16[32,16]{1,0} parameter(1)
  ROOT %dot.1 = bf16[64,16]{1,0} dot(%parameter_0, %parameter_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main.9 (p.0: bf16[64,32], p.1: bf16[32,16], p.2: f8e4m3fn[64,32], p.3: f8e4m3fn[16,32]) -> bf16[64,16] {
  %p.0 = bf16[64,32]{1,0} parameter(0)
  %p.1 = bf16[32,16]{1,0} parameter(1)
  %p.2 = f8e4m3fn[64,32]{1,0} parameter(2)
  %p.3 = f8e4m3fn[16,32]{1,0} parameter(3)
  %custom-call.1 = (bf16[64,16]{1,0}, s8[4194304]{0}) custom-call(%p.0, %p.1), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{}}
  %gte.1 = bf16[64,16]{1,0} get-tuple-element(%custom-call.1), index=0
  %custom-call.2 = (f32[64,16]{1,0}, s8[4194304]{0}) custom-call(%p.2, %p.3), custom_call_target="__cublas$lt$matmul$f8", backend_config={"gemm_backend_config":{}}
  %gemm_fusion_dot.1 = bf16[64,16]{1,0} fusion(%p.0, %p.1), kind=kCustom, calls=%gemm_fusion_dot.1_computation, backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}
  ROOT %add.1 = bf16[64,16]{1,0} add(%gte.1, %gemm_fusion_dot.1)
}
"""


def test_tuple_typed_custom_calls_are_read():
    instrs = parse(OPTIMIZED)
    assert instrs["custom-call.2"][:3] == ("(f32[64,16]{1,0}, s8[4194304]{0})", "custom-call",
                                          ["p.2", "p.3"])


def test_every_gemm_is_counted_by_operand_types():
    assert gpu.gemm_types(OPTIMIZED) == {"bf16 x bf16": 2, "f8e4m3fn x f8e4m3fn": 1}


def test_profile_kinds_of_kernel_names():
    assert [fp8_profile.kind(n) for n in (
        "sm90_xmma_gemm_e4m3e4m3_f32", "loop_convert_fusion_3", "transpose_2",
        "input_reduce_fusion", "memset")] == ["gemm", "fusion", "copy/transpose", "fusion",
                                              "other"]


def test_profile_counts_a_fusions_bytes_from_its_operand_and_result_types():
    """The profile's traffic columns: bytes at a fusion's boundary, a tuple
    result (a multi-output fusion) summed, float8 one byte an element."""
    hlo = OPTIMIZED.replace(
        "  ROOT %add.1", "  %input_convert_transpose_fusion.3 = (f8e4m3fn[32,64]{1,0}, "
        "f8e4m3fn[64,32]{1,0}) fusion(%p.0), kind=kInput, calls=%gemm_fusion_dot.1_computation\n"
        "  ROOT %add.1")
    got = fp8_profile.fusion_bytes(hlo)
    assert got == {"gemm_fusion_dot_1": 64 * 32 * 2 + 32 * 16 * 2 + 64 * 16 * 2,
                   "input_convert_transpose_fusion_3": 64 * 32 * 2 + 2 * 64 * 32}
    assert fp8_profile.nbytes("(f32[3], s8[4194304]{0})") == 12 + 4194304
