"""experiments/report/kernels (scripts/kernels/kernel_report.py): JIT-faithful specialisation, binary parsing
(cubin.py), launch capture, and the report itself.

conftest sets TRITON_INTERPRET=1, under which @triton.jit makes interpreted functions; the unit tests here
wrap their kernel in a JITFunction by hand (nothing is launched), and the end-to-end report runs in a
subprocess without TRITON_INTERPRET.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton.language as tl
from triton.runtime.jit import JITFunction

from experiments.report.kernels import aot as kr
from experiments.report.kernels import cubin as cs
from experiments.report.kernels import recipes

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "kernels" / "kernel_report.py"


def _scale_kernel(state_ptr, out_ptr, slots_ptr, n, stride, count, scale, big, maybe, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + pid).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(state_ptr + slot * big + offs * stride, mask=mask, other=0.0)
    tl.store(out_ptr + pid * BLOCK + offs, v * scale + count, mask=mask)


SCALE = JITFunction(_scale_kernel, do_not_specialize=["count"])


def _args(state: torch.Tensor, **over):
    args = dict(state_ptr=state, out_ptr=torch.empty(64), slots_ptr=torch.zeros(2, dtype=torch.int32), n=64,
                stride=1, count=1, scale=2.0, big=2**33, maybe=None, BLOCK=64)
    args.update(over)
    return args


def test_specialize_follows_the_jit_rules():
    buf = torch.zeros(80)
    spec = kr.specialize(SCALE, _args(buf[1:65]))
    assert spec.signature == {"state_ptr": "*fp32", "out_ptr": "*fp32", "slots_ptr": "*i32", "n": "i32",
                              "stride": "constexpr", "count": "i32", "scale": "fp32", "big": "i64",
                              "maybe": "constexpr", "BLOCK": "constexpr"}
    assert spec.constexprs == {"stride": 1, "maybe": None, "BLOCK": 64}   # count is in do_not_specialize
    div = [["tt.divisibility", 16]]
    # state_ptr is 4 bytes off a 16-byte boundary: no divisibility; n = 64 and big = 2^33 are multiples of 16
    assert spec.attrs == {(1,): div, (2,): div, (3,): div, (7,): div}
    aligned = kr.specialize(SCALE, _args(buf[4:68], n=65, stride=3))
    assert aligned.signature["stride"] == "i32" and "stride" not in aligned.constexprs
    assert (0,) in aligned.attrs and (3,) not in aligned.attrs and (4,) not in aligned.attrs
    assert kr.specialize(SCALE, _args(buf, out_ptr=torch.zeros(4, dtype=torch.bfloat16))).signature["out_ptr"] == \
        "*bf16"


def test_specialize_agrees_with_tritons_own_specialiser():
    native = pytest.importorskip("triton._C.libtriton").native_specialize_impl
    from triton.compiler.compiler import make_backend

    backend = make_backend(kr.GPUTarget("cuda", 90, 32))
    buf = torch.zeros(80)
    for state in (buf[:64], buf[1:65], buf[4:68]):
        for n, stride, big in ((64, 1, 2**33), (17, 16, -32), (0, 5, 2**31 - 1), (-16, 2**40 + 1, 2**63)):
            args = _args(state, n=n, stride=stride, big=big)
            spec = kr.specialize(SCALE, args)
            for i, kp in enumerate(SCALE.params):
                if kp.is_constexpr:
                    continue
                kind, attr = native(backend, args[kp.name], kp.is_const, not kp.do_not_specialize,
                                    not kp.do_not_specialize_on_alignment)
                assert spec.signature[kp.name] == kind, (kp.name, args[kp.name])
                if kind == "constexpr":
                    assert spec.constexprs[kp.name] == attr
                else:
                    assert ((i,) in spec.attrs) == (attr == "D"), (kp.name, args[kp.name])


def test_specialize_agrees_with_the_jit_binder():
    """The JIT's own path (triton 3.7: binder + _pack_args) on the same arguments, where it exists."""
    jit = pytest.importorskip("triton.runtime.jit")
    if not hasattr(jit, "create_function_from_signature") or not hasattr(SCALE, "_pack_args"):
        pytest.skip("this triton has another JIT binder")
    from triton.compiler.compiler import make_backend

    backend = make_backend(kr.GPUTarget("cuda", 100, 32))
    binder = jit.create_function_from_signature(SCALE.signature, SCALE.params, backend)
    buf = torch.zeros(80)
    for args in (_args(buf[1:65]), _args(buf[4:68], n=65, stride=3, count=16), _args(buf, big=7, stride=32)):
        bound, specialization, options = binder(**args)
        _, signature, constexprs, attrs = SCALE._pack_args(backend, {}, bound, specialization, options)
        spec = kr.specialize(SCALE, args)
        assert spec.signature == signature
        assert {(SCALE.arg_names.index(k),): v for k, v in spec.constexprs.items()} == constexprs
        assert spec.attrs == {k: v for k, v in attrs.items() if v}


def test_capture_records_launches_without_running_them():
    state, original = torch.zeros(64), JITFunction.run
    with kr.capture_launches() as launches:
        SCALE[(3,)](state, torch.empty(64), torch.zeros(2, dtype=torch.int32), 64, 1, 1, 2.0, 16, None,
                    BLOCK=64, num_warps=2)
        SCALE[lambda meta: (meta["n"] // meta["BLOCK"], 2)](state, torch.empty(64), torch.zeros(2, dtype=torch.int32),
                                                              128, 1, 1, 2.0, 16, None, BLOCK=32)
    assert JITFunction.run is original
    assert [lch.grid for lch in launches] == [(3,), (4, 2)]
    assert launches[0].options == {"num_warps": 2} and launches[1].options == {}
    assert launches[0].args["state_ptr"] is state and launches[1].args["BLOCK"] == 32
    assert kr.compile_options(launches[1]) == {"num_warps": 4, "num_stages": 3}
    assert torch.count_nonzero(state) == 0


def test_parsers_of_the_binary_tools():
    usage = "Function k:\n  REG:40 STACK:200 SHARED:1024 LOCAL:0 CONSTANT[0]:568 TEXTURE:0"
    assert cs.parse_resource_usage(usage) == (40, 200, 1024, 0)
    sass = """@!P0 LDG.E.128 R12, desc[UR4][R2.64] ;
              LDG.E R4, desc[UR4][R2.64+0x800] ;
              LDG.E.64.CONSTANT R6, desc[UR4][R8.64] ;
              LDG.E.U16 R9, desc[UR4][R8.64] ;
              @!P0 LDG.E.128 R16, desc[UR4][R2.64+0x10] ;
              LDGSTS.E.BYPASS.128 [R5], desc[UR4][R2.64] ;
              LDGDEPBAR ;
              STL [R1], R3 ;
              STL.64 [R1+0x8], R4 ;
              LDL.LU R3, [R1] ;"""
    assert cs.count_global_loads(sass) == {16: 3, 4: 1, 8: 1, 2: 1}
    assert cs.global_load_counts(sass)[("LDGSTS", 16)] == 1 and cs.global_load_counts(sass)[("LDG", 16)] == 2
    assert cs.spill_store_bytes(sass) == 12
    assert cs.describe_widths({16: 2, 4: 1}) == "128-bit x2" and cs.describe_widths({}) == "none"


def test_ptx_trace_attributes_loads_to_their_pointer():
    ptx = """
    .param .u64 .ptr .global .align 1 k_param_0,
    .param .u64 .ptr .global .align 1 k_param_1,
    .param .u64 .ptr .global .align 1 k_param_2,
    .param .u32 k_param_3,
    ld.param.b64 	%rd5, [k_param_0];
    ld.param.b64 	%rd6, [k_param_2];
    ld.param.b32 	%r9, [k_param_3];
    @%p1 ld.global.b32 { %r1 }, [ %rd6 + 0 ];
    mul.wide.s32 	%rd7, %r1, %r9;
    add.s64 	%rd8, %rd5, %rd7;
    @%p1 ld.global.v4.b32 { %r2, %r3, %r4, %r5 }, [ %rd8 + 0 ];
    @%p1 ld.global.L1::evict_last.v2.b32 { %r6, %r7 }, [ %rd8 + 16 ];
    add.s64 	%rd9, %rd8, 64;
    cp.async.cg.shared.global [ %r10 + 0 ], [ %rd9 + 0 ], 0x10, %r11;
    cp.async.commit_group;
    """
    # the second and third loads: pointer param 0 plus an offset from a loaded slot (not followed) times
    # the int param 3 (not a pointer: not counted)
    assert cs.ptx_load_widths_by_param(ptx) == {2: {4: 1}, 0: {16: 2, 8: 1}}


def alignment_builds(out_dir: str, target: int) -> dict:
    """Build the SCALE kernel with an aligned and a misaligned state pointer; report what each build gave."""
    builder = kr.Builder(Path(out_dir))
    buf = torch.zeros(160)
    builds = {}
    for name, state in (("aligned", buf[:128]), ("misaligned", buf[1:129])):
        launch = kr.Launch(SCALE, _args(state, n=128, BLOCK=128), (2,), {"num_warps": 1})
        _, build = builder.build(launch, target)
        builds[name] = {"status": build.status, "spill": build.spill, "num_warps": build.num_warps,
                        "state_load": build.state_load}
    builder.build(kr.Launch(SCALE, _args(buf[:128], n=128, BLOCK=128), (5,), {"num_warps": 1}), target)
    return {"builds": builds, "compiled": len(builder.cache)}


@pytest.mark.parametrize("target", kr.TARGETS)
def test_alignment_decides_the_load_width(tmp_path, target):
    """The point of mirroring the JIT: an aligned state pointer builds 128-bit loads, a misaligned one not.

    Compiled in a child process without TRITON_INTERPRET: in triton 3.7, once the interpreter has run a kernel
    that calls a jitted helper (tl.sum, tl.cumsum, ...) it leaves triton.language patched for the rest of the
    process, and a real compile there fails ('ir.value' object has no attribute 'dtype') on a cold cache.
    """
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    code = (f"import json; import test_kernel_report as t; "
            f"print(json.dumps(t.alignment_builds({str(tmp_path)!r}, {target})))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for build in result["builds"].values():
        assert build["status"] == "ok" and build["spill"] == 0 and build["num_warps"] == 1, build
    assert {name: b["state_load"] for name, b in result["builds"].items()} == \
        {"aligned": "128-bit x1", "misaligned": "32-bit x4"}
    assert result["compiled"] == 2      # same specialisation, other grid: compiled once


def test_missing_recipe_module_is_reported_not_raised():
    with pytest.raises(recipes.MissingModule):
        recipes.public("replayssm.no_such_module", "f")
    with pytest.raises(recipes.MissingModule):
        recipes.public("replayssm.geometry", "no_such_function")
    assert recipes.public("replayssm.geometry", "get_geometry") is not None
    rows = [{"status": "ok"}, {"status": "missing: no module x"}, {"status": "SPILL"}]
    assert recipes.failures(rows) == [rows[2]]


def test_report_on_super_tp8_both_targets(tmp_path):
    """The whole report on Nemotron-3-Super at TP8 (16 heads, 1 group): every kernel that exists builds for
    sm_90 and sm_100 without spilling."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])   # the script imports experiments
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--geometry", "nemotron3_super_120b", "--tp", "8",
                           "--fp32-state-only", "--json", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.exists(), proc.stderr[-3000:]
    report = json.loads(out.read_text())
    rows, steps = report["rows"], report["steps"]
    assert "| kernel" in proc.stdout
    present = [r for r in rows if not r["status"].startswith("missing")]
    assert present, "no Mamba-2 recipe produced a kernel"
    assert all(r["geometry"] == "nemotron3_super_120b@tp8" for r in rows)
    by_target = {t: {(r["method"], r["kernel"], r["variant"]) for r in present if r["target"] == t}
                 for t in ("sm_90", "sm_100")}
    assert by_target["sm_90"] == by_target["sm_100"]
    broken = [f"{r['target']} {r['method']} {r['kernel']}: {r['status']} (spill {r.get('spill')} B)"
              for r in recipes.failures(rows)]
    assert not broken, "\n".join(broken)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert all(r["registers"] > 0 and r["spill"] == 0 for r in present)
    # the predictions: every built kernel has its dynamic shared memory, SASS mix, occupancy and issue floor
    for r in present:
        assert r["dyn_shared"] >= 0 and r["path_min"] > 0 and (r["sass"] >= r["path_max"] or r["loops"]), r
        assert r["path_min"] <= r["path_max"] and 0 < r["occupancy"] <= 1 and r["issue_us"] >= 0, r
        assert r["issue_us"] > 0 or r["programs"] < 1000, r       # only a tiny grid (the cursor kernel) rounds to 0
        assert r["sass"] >= r["shfl"] + r["bar"] + r["mma"] + r["mufu"] + r["lds"] + r["sts"], r
    # the Mamba-2 AR step at b256 (the default point): its kernels' programs scale with the batch, byte time beside
    step = next(s for s in steps if s["method"] == "mamba2.replay[output_only]" and s["target"] == "sm_90")
    assert step["point"] == "b256 L16" and step["byte_us"] > 0 and step["issue_us_cycle"] >= step["issue_us"] > 0
    assert step["bound"] in ("issue", "bytes")
    ssu = next(r for r in present if r["method"] == "mamba2.ssu" and r["target"] == "sm_90")
    assert ssu["programs"] == 256 * ssu["programs_per_row"] + ssu["programs_fixed"] and ssu["programs_per_row"] > 0


# --------------------------------------------------------------------------- SASS paths, occupancy, ncu evidence

SASS = """
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/              @!P0 EXIT ;
        /*0020*/                   ISETP.NE.AND P1, PT, R0, RZ, PT ;
        /*0030*/               @P1 BRA 0x70 ;
        /*0040*/                   FADD R1, R1, R1 ;
        /*0050*/                   SHFL.BFLY PT, R2, R1, 0x1, 0x1f ;
        /*0060*/                   BRA 0xd0 ;
        /*0070*/                   MOV R3, RZ ;
        /*0080*/                   HMMA.16816.F32.TF32 R4, R8, R10, R4 ;
        /*0090*/                   MUFU.EX2 R5, R5 ;
        /*00a0*/                   IADD3 R3, R3, 0x1, RZ ;
        /*00b0*/               @P2 BRA 0x80 ;
        /*00c0*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*00d0*/                   STG.E desc[UR4][R2.64], R1 ;
        /*00e0*/                   EXIT ;
        /*00f0*/                   BRA 0xf0;
        /*0100*/                   NOP;
"""
TTGIR = """
    %c0_i32 = arith.constant 0 : i32
    %c128_i32 = arith.constant 128 : i32
    %c16_i32 = arith.constant 16 : i32
    %a:2 = scf.for %i = %c0_i32 to %c128_i32 step %c16_i32 iter_args(%x = %c0_i32) -> (i32) : i32 {
    %b = scf.for %j = %c0_i32 to %n step %c16_i32 iter_args(%y = %c0_i32) -> (i32) : i32 {
"""


def test_sass_mix_and_paths_by_hand():
    from experiments.report.kernels import sass

    instrs = sass.parse_sass(SASS)
    assert len(instrs) == 15                     # the trap loop and NOP after the last EXIT are padding
    assert sass.instruction_mix(instrs) == {"total": 15, "shfl": 1, "bar": 1, "lds": 0, "sts": 0, "mma": 1,
                                            "mufu": 1, "ldg": 0, "stg": 1}
    assert sass.ttgir_loop_trips(TTGIR) == [8, None]
    # then-arm: 2 + 2 + 3 + 2 = 9; else-arm: 2 + 2 + 1 + 8 x 4 (the loop) + 1 + 2 = 40; the early EXIT after 2
    # instructions stores nothing, so it is not the shortest path
    p = sass.paths(instrs, [8])
    assert (p.path_min, p.path_max, p.loops, p.loops_unknown, p.trips) == (9, 40, 1, 0, (8,))
    unknown = sass.paths(instrs, [8, None])      # two TTGIR loops for one SASS loop: the body counts once
    assert (unknown.path_max, unknown.loops_unknown) == (12, 1) and "trip counts not applied" in unknown.note
    assert cs.sass_statistics(SASS)["loops"] == "?"
    # sm_100 writes a uniform-predicate branch with the predicate as an operand: conditional all the same
    blackwell = sass.parse_sass(SASS.replace("@P2 BRA 0x80", "BRA.U !UP2, 0x80"))
    assert (sass.paths(blackwell, [8]).path_min, sass.paths(blackwell, [8]).path_max) == (9, 40)


def test_occupancy_reproduces_ncu_and_the_limits():
    from experiments.report.kernels import occupancy as oc

    # results/h200/route-check-*/ncu: 163 regs / 4 warps -> 3 blocks (18.75 %), 72 -> 7, 48 -> 10
    assert [oc.occupancy(r, 4, s, 90).blocks for r, s in ((163, 8192), (72, 8192), (48, 256))] == [3, 7, 10]
    o = oc.occupancy(163, 4, 8192, 90)
    assert (o.warps, o.occupancy, o.limiter) == (12, 0.1875, "registers")
    assert oc.occupancy(32, 4, 60 * 1024, 90).blocks == 3 and oc.occupancy(32, 4, 60 * 1024, 90).limiter == "shared"
    assert oc.occupancy(32, 4, 228 * 1024, 90).blocks == 0           # over the 227 KB a block may have
    assert oc.occupancy(16, 1, 0, 100).blocks == 32 and oc.occupancy(16, 32, 0, 90).limiter == "warps"
    assert oc.block_shared(1024, 8192, 90) == 8192 and oc.block_shared(3072, 0, 90) == 2048
    for lim in oc.LIMITS.values():
        assert "Programming Guide" in lim.source and lim.regs_per_sm == 65536 and lim.reserved_smem == 1024


NCU_DIR = ROOT / "results" / "h200" / "route-check-20261204T130226Z-feec103"


def test_ncu_parsing_derives_instructions_per_warp():
    from experiments.report.kernels import ncu_compare as nc

    launches = nc.ncu_launches(NCU_DIR / "ncu" / "dram-output_only-replay_ar-output_only.ncu.txt")
    assert [lch["kernel"] for lch in launches] == ["_gdn_replay_step_kernel"] * 2
    m = nc.measured(launches[0])
    # 0.49 issues/cycle/scheduler x 4 x 132 SMs x 1,132,467.48 active cycles / (65,536 programs x 4 warps)
    assert m["insts_per_warp"] == pytest.approx(0.49 * 4 * 132 * 1132467.48 / 262144)
    assert (m["registers"], m["occupancy"], m["dyn_shared"], m["programs"]) == pytest.approx((163, 0.1875, 8190, 65536))


def _gpu_stack_python() -> str | None:
    """A python whose Triton is the one ncu's run used (env.json), or None."""
    want = json.loads((NCU_DIR / "env.json").read_text())["triton"]
    import triton

    if triton.__version__ == want:
        return sys.executable
    gs = ROOT / ".venv-gpustack" / "bin" / "python"
    if gs.exists():
        ver = subprocess.run([str(gs), "-c", "import triton; print(triton.__version__)"], capture_output=True,
                             text=True, timeout=120).stdout.strip()
        if ver == want:
            return str(gs)
    return None


def test_report_agrees_with_the_h200_ncu_report(tmp_path):
    """GDN's steps at Qwen3.5-122B b256 (the kernels ncu profiled at feec103), built by the Triton that ran there:
    registers, theoretical occupancy, dynamic shared memory and instructions per warp within 10 % of ncu's."""
    python = _gpu_stack_python()
    if python is None:
        pytest.skip("ncu ran Triton 3.6.0: needs it here or in .venv-gpustack (make test-gpu-stack builds it)")
    from experiments.report.kernels import ncu_compare as nc

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = tmp_path / "report.json"
    proc = subprocess.run([python, str(SCRIPT), "--geometry", "qwen35_122b_a10b", "--target", "90", "--fp32-state-only",
                           "--method", "gdn.replay", "--method", "gdn.replay[state_and_output]", "--method",
                           "gdn.recurrent", "--batch", "256", "--json", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = nc.compare(json.loads(out.read_text())["rows"], NCU_DIR / "ncu", "qwen35_122b_a10b")
    assert sorted({r["method"] for r in rows}) == ["gdn.recurrent", "gdn.replay", "gdn.replay[state_and_output]"]
    for r in rows:
        for k in ("registers", "occupancy", "dyn_shared", "insts_per_warp"):
            assert 0.9 <= r[f"{k}_ratio"] <= 1.1, (r["file"], k, r[f"{k}_ncu"], r[f"{k}_report"])
