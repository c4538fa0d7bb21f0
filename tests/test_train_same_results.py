"""The restructured training engine trains exactly what the engine before it trained: same-seed runs of
each objective give bit-identical weights, checkpoints and metrics.

The expected fingerprints (tests/_same_results.py) were recorded by running that module on the code of
commit 8791fc2 (the engine before objectives and the run state, with the kernel plan), torch 2.13.0+cpu,
CPU capability AVX512 (an Intel Xeon), one thread: ``PYTHONPATH=src:tests python -m _same_results``. Its
weights and checkpoints are those of the engine before the kernel plan (commit fd77616) too; the metrics
differ from it only by results.json's ``eval_split`` entry, which that engine did not write. Other CPU kinds
or torch builds compute other last bits, so the comparison runs where those match: a second set was recorded
the same way (8791fc2's engine) on an AVX2-only AMD EPYC, a third on an AMD EPYC with AVX-512. torch calls
the Intel and the AMD AVX-512 kinds both AVX512 but their fp32 kernels round differently, so a set is keyed
by (torch, CPU capability, CPU vendor).
"""
import pytest
import torch

from _same_results import run_all

pytestmark = pytest.mark.slow

EXPECTED = {
    "classification": {"weights": "a7b7f808c06802146890dd99396acd7b9cbf64f5a28ba396f71653ee68f9c489",
                       "checkpoint": "b9b7828732cfc918cf0060612ca597b4b658f5dd36910d278c51d3f9ef7fb324",
                       "metrics": "3489058b829514c813e7978776e63b1f0dd47ca6d9c82595b231fe9c4089ae9e",
                       "test_top1": 0.2890625, "test_loss": 1.4543886184692383, "steps": 32},
    "distill_hard_token": {"weights": "6be3d24dfce0beae4516483c28dc281ad1b728ed3a2a50ace7e7e6cc121ceace",
                           "checkpoint": "3ae1758940341bccce5f490a315e986b024acde01869a5dceb87d9520d242166",
                           "metrics": "6a1ee287e21a9ff65d598fa14ff09c3615f9a630972e37de3e3b3c65f5adc554",
                           "test_top1": 0.21875, "test_loss": 1.543775737285614, "teacher_test_top1": 0.2890625,
                           "steps": 32},
    "distill_soft": {"weights": "3b9eddae40baf8ab2ca8610707b8fd1c40b41d40ee8468ae9bd5197316d1213d",
                     "checkpoint": "cc48b565f2975bc8fd55169829a32502e86ba3c65b14d19014c0fcafcc7169e5",
                     "metrics": "f16efa6da150affa56f8a5e477ad1dde41e40c50b5918bbdfad41c0638ac17ee",
                     "test_top1": 0.3359375, "test_loss": 1.4470973014831543, "teacher_test_top1": 0.2890625,
                     "steps": 32},
    "mpp": {"weights": "7dbd5431b736e1c9982eacc6d3fa6d2e851c094891bc12d16c3819a36b2da11d",
            "checkpoint": "9fe80589945b3ea33aafe798dcd4c0fc8e8dccc28d6c5ac99a5364c88153aaf3",
            "metrics": "4a67da392d013437debaaa6f92f0cd21f269104252ad246b93e6d3b468198adf",
            "val_mpp_loss": 1.4146080017089844, "steps": 32},
    # make demo's recipe (fmnist-demo, real Fashion-MNIST), its first 30 steps, tested on 1,000 test images
    "demo": {"weights": "19d1bbce9f748ed27d9fe38123600c774d09e3162b9607d5674f3a6786364e0f",
             "checkpoint": "ec7d310e8c14ad5c7f48977e56644115d9f3c5fc5193af0e777e58c6beb5fc86",
             "metrics": "1b816961b0ce017aa51c8ad1ce39be78ff4afa219788895a363f9b3c5302fecd",
             "test_top1": 0.466, "test_loss": 1.738225341796875, "steps": 30},
}


# the same runs on an AMD EPYC without AVX-512 (torch 2.13.0+cpu, CPU capability AVX2): recorded on 2026-12-06
# with tests/_same_results.py over the src of 8791fc2 (PYTHONPATH=OLD/src:tests); 2a3994f gave the same
EXPECTED_AVX2 = {
    "classification": {"weights": "c56c81c3222d5da0f4edcec0e60351f82c4626e4a2073947e4ff3c650e219107",
                       "checkpoint": "710f129eb8a18329719fa7d9828dfdfbcd48d438b2494835e7b51475dce149c0",
                       "metrics": "2d881ccfd8b0b591508338f0db2b42bcd9e2299fefd960bf2da9390d2d432692",
                       "test_top1": 0.2890625, "test_loss": 1.454387903213501, "steps": 32},
    "distill_hard_token": {"weights": "97dbd892df03be3e1579c059be0abad45977253a105e1e0f2bb5c40ec41f74a4",
                           "checkpoint": "0ca8c4038c81620615a14c74e2a89393ef23acbd40c80bd93e2a303ba0a71a34",
                           "metrics": "ae3ac1f48d39f3abdf05c1a2279fa74ff57e830b6cb2d9402692294c47049c77",
                           "test_top1": 0.21875, "test_loss": 1.5437747836112976, "teacher_test_top1": 0.2890625,
                           "steps": 32},
    "distill_soft": {"weights": "65c76d6544ac46c1eb5827a044c9e4e1a2acc1eb633144cfe074f95a4d81214b",
                     "checkpoint": "7b4d7f6a2ae5b91d25947137a29a2e2479851fa434b38626e1e40ce901aae349",
                     "metrics": "4a2ae1788e5c7c02a02975e222dc56b265ab1e5caba65ee086482fcba194dc63",
                     "test_top1": 0.3359375, "test_loss": 1.4470980167388916, "teacher_test_top1": 0.2890625,
                     "steps": 32},
    "mpp": {"weights": "47c05136a857bd6f9d6859026180f9eac5f62da5f1b55300ffc462fc274ec0b0",
            "checkpoint": "34ac70fd405ebf1f13f7300694983496293dd5506a6905370afc4da6398f3aa4",
            "metrics": "1eebaad2c2392063d17b68821eb8f0a1200be3a27df59b7f3cab0b2491a384ed",
            "val_mpp_loss": 1.4146078824996948, "steps": 32},
    # make demo's recipe (fmnist-demo, real Fashion-MNIST), its first 30 steps, tested on 1,000 test images
    "demo": {"weights": "c14e720a422ad4afd436b241f5e9638abd4255c0bddb402244b40de1b81d1ff9",
             "checkpoint": "631a8a9d27a9b5b0858deb5ab0cdb70e9acb5c036b36f7e9d87700b4a211148e",
             "metrics": "14cddf1b2b45f498fcfcd1378dc9cf57d5b673f888932ba5f37e21ed5b2bedf8", "test_top1": 0.466,
             "test_loss": 1.738225341796875, "steps": 30},
}

# the same runs on an AMD EPYC with AVX-512 (family 25 model 17, no AMX; torch 2.13.0+cpu, CPU capability
# AVX512): recorded on 2026-12-07 with tests/_same_results.py over the src of 8791fc2 (PYTHONPATH=OLD/src:tests);
# 227de81 gave the same. MKL and oneDNN pick other fp32 kernels on it than on the Intel Xeon of EXPECTED, though
# torch names both AVX512, so the recorded sets are told apart by the CPU's vendor as well
EXPECTED_AMD_AVX512 = {
    "classification": {"weights": "9368d74c71bea6b90dcee50a35a68b50257c406fa21a8ce0c12afe05d8e4457f",
                       "checkpoint": "b548a0cfa1139aa62f9736f48d8b5408036f984b6d4566c43d00ca9ac7202a7c",
                       "metrics": "0f233ffa0b1c42871054f6018a67cc716424e1d165302ba83332ad191965efdf",
                       "test_top1": 0.2890625, "test_loss": 1.4543880820274353, "steps": 32},
    "distill_hard_token": {"weights": "b06ea5f0e1ef9cab185c94f565c899fbf123d57633b7921149b1942d3266c5f9",
                           "checkpoint": "3ac482f6bce6dcc2af162742e30c49c87240b3ff39aa3fd0a9f2b2b495c3218a",
                           "metrics": "c2e4ab368e10929178d3b3a36c604f7fc98e02ce2220fc1b17abe372c9f809d3",
                           "test_top1": 0.21875, "test_loss": 1.5437743067741394, "teacher_test_top1": 0.2890625,
                           "steps": 32},
    "distill_soft": {"weights": "a361dce3adc52c052d3a4f8bc4568719d90a64f273676c550479f3bb8a1c1bc5",
                     "checkpoint": "66dd17d1958379be8986e0e7feee77c9a2392b0a7df499ae59aec3c8e94b03c0",
                     "metrics": "2e21e36ecd28acb10c994f645cce054d3affed03fcb2676af7d449cb39694b3f",
                     "test_top1": 0.3359375, "test_loss": 1.447097897529602, "teacher_test_top1": 0.2890625,
                     "steps": 32},
    "mpp": {"weights": "c78cd3d5cff43925c6734687c451fca232b5a21a9dff135f735f3bfa6e948604",
            "checkpoint": "0c900b1bab338953409cc090b6e2080cef9e021a833742d3ab049b0bc4b1300e",
            "metrics": "dd962486ee74a73dc1f61a205966874b606da4033b29fba1ee7bebc8f84a961b",
            "val_mpp_loss": 1.4146080017089844, "steps": 32},
    # make demo's recipe (fmnist-demo, real Fashion-MNIST), its first 30 steps, tested on 1,000 test images
    "demo": {"weights": "691dfffbda354c2acf11eefda3b20b3818441111a796f167a92b6836fcfaa8bb",
             "checkpoint": "4a1ef72612f17a300cc8220dd2b45fbf4053fb5fbed448ca50dbae0a228c5ec9",
             "metrics": "29127a7bd33ffe04b09a9e2d4f408a5d9fc7cb89b40a3b1636754d0a53ace6ed",
             "test_top1": 0.466, "test_loss": 1.738225341796875, "steps": 30},
}


def _vendor() -> str:
    """The CPU's vendor (GenuineIntel, AuthenticAMD, ...; "" where /proc/cpuinfo does not say)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("vendor_id")), "")
    except OSError:
        return ""


RECORDED = {("2.13.0+cpu", "AVX512", "GenuineIntel"): EXPECTED, ("2.13.0+cpu", "AVX2", "AuthenticAMD"): EXPECTED_AVX2,
            ("2.13.0+cpu", "AVX512", "AuthenticAMD"): EXPECTED_AMD_AVX512}


def test_same_seed_runs_of_every_objective_match_the_engine_before(tmp_path):
    here = (torch.__version__, torch.backends.cpu.get_cpu_capability(), _vendor())
    if here not in RECORDED:
        pytest.skip(f"the fingerprints were recorded with torch/CPU {sorted(RECORDED)}; this is {here}")
    got = run_all(tmp_path)
    assert got == RECORDED[here]
