"""The GPU benchmarks count an optimized XLA:GPU program's GEMMs from its
text. XLA prints a cuBLAS call with its workspace as a tuple-typed
custom-call, `(bf16[..]{1,0}, s8[..]{0}) custom-call(...)`: the parser must
read those (a parser that skips them counts only the Triton GEMM fusions)."""
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
    """cuBLAS's Hopper GEMMs run as nvjet_sm90_* kernels (the H100 profile)."""
    assert [fp8_profile.kind(n) for n in (
        "sm90_xmma_gemm_e4m3e4m3_f32", "loop_convert_fusion_3", "transpose_2",
        "input_reduce_fusion", "memset", "nvjet_sm90_qqsss_256x128_128x4_1x2_h_bz_coopA_TNT")
    ] == ["gemm", "fusion", "copy/transpose", "fusion", "other", "gemm"]


def test_profile_roles_from_kernel_names_and_result_types():
    """fp8_profile.role: a quantization by its float8 results (one layout or
    both), the history's concatenates, reductions with and without
    elementwise outputs, casts."""
    cases = {("nvjet_sm90_qrsss_144x128", ""): "GEMM",
             ("input_convert_transpose_fusion_20",
              "(f8e4m3fn[16384,8192]{1,0}, f8e4m3fn[8192,16384]{1,0})"): "quantize, both layouts",
             ("loop_convert_fusion_2", "f8e4m3fn[16384,4096]{1,0}"): "quantize",
             ("input_concatenate_fusion_15", "f32[3,16]{1,0}"): "amax history / stacks",
             ("input_add_reduce_fusion_6", "(f32[4096]{0}, f32[4096,16384]{1,0})"):
                 "reduction with outputs",
             ("input_reduce_fusion_11", "f32[8192]{0}"): "reduction",
             ("wrapped_convert_5", "bf16[16384,4096]{1,0}"): "cast",
             ("loop_add_fusion_3", "bf16[8192,16384]{1,0}"): "other fusion",
             ("Memset 0", ""): "other"}
    assert {k: fp8_profile.role(*k) for k in cases} == cases


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


# Three fusions of an optimized program: the last stage of an amax inside a
# history's concatenate (buried: the H100 profile's serial kernels), a
# reduction whose result is converted (its epilogue), and a multi-output
# reduction that also writes an elementwise result.
FUSIONS = """\
%fused_concatenate.1 (param_0: f32[3,16], param_1: f32[4096]) -> f32[3,16] {
  %param_1 = f32[4096]{0} parameter(1)
  %c = f32[] constant(-inf)
  %reduce_max.1 = f32[] reduce(%param_1, %c), dimensions={0}, to_apply=%max
  %bitcast.1 = f32[1,1]{1,0} bitcast(%reduce_max.1)
  %param_0 = f32[3,16]{1,0} parameter(0)
  %slice.1 = f32[3,15]{1,0} slice(%param_0), slice={[0:3], [0:15]}
  %slice.2 = f32[2,1]{1,0} slice(%param_0), slice={[1:3], [15:16]}
  %concatenate.0 = f32[3,1]{1,0} concatenate(%bitcast.1, %slice.2), dimensions={0}
  ROOT %concatenate.1 = f32[3,16]{1,0} concatenate(%concatenate.0, %slice.1), dimensions={1}
}

%fused_reduce.2 (param_0.1: bf16[8192]) -> f32[] {
  %param_0.1 = bf16[8192]{0} parameter(0)
  %c.1 = bf16[] constant(-inf)
  %reduce_max.2 = bf16[] reduce(%param_0.1, %c.1), dimensions={0}, to_apply=%max
  ROOT %convert.2 = f32[] convert(%reduce_max.2)
}

%fused_add_reduce.3 (param_0.2: f32[64,32]) -> (f32[64], f32[64,32]) {
  %param_0.2 = f32[64,32]{1,0} parameter(0)
  %add.3 = f32[64,32]{1,0} add(%param_0.2, %param_0.2)
  %c.2 = f32[] constant(0)
  %reduce.3 = f32[64]{0} reduce(%add.3, %c.2), dimensions={1}, to_apply=%sum
  ROOT %tuple.3 = (f32[64]{0}, f32[64,32]{1,0}) tuple(%reduce.3, %add.3)
}

ENTRY %main.4 (h: f32[3,16], a: f32[4096], b: bf16[8192], x: f32[64,32]) -> f32[3,16] {
  %h = f32[3,16]{1,0} parameter(0)
  %a = f32[4096]{0} parameter(1)
  %b = bf16[8192]{0} parameter(2)
  %x = f32[64,32]{1,0} parameter(3)
  %input_reduce_fusion.2 = f32[] fusion(%b), kind=kCustom, calls=%fused_reduce.2
  %input_add_reduce_fusion.3 = (f32[64]{0}, f32[64,32]{1,0}) fusion(%x), kind=kInput, calls=%fused_add_reduce.3
  ROOT %input_concatenate_fusion.1 = f32[3,16]{1,0} fusion(%h, %a), kind=kInput, calls=%fused_concatenate.1
}
"""


def test_profile_finds_the_reductions_buried_in_other_fusions():
    """fp8_profile.buried_reductions: a reduce that no output of its fusion
    has the shape of (the amax stage inside the history's concatenate, which
    xla_amp.fp8._quant.pinned_amax should take out on XLA:GPU); a reduction
    fusion's own result, converted or beside an elementwise output, is not."""
    assert fp8_profile.buried_reductions(FUSIONS) == {"input_concatenate_fusion_1": ["f32[4096]"]}
    assert fp8_profile.buried_reductions(OPTIMIZED) == {}
