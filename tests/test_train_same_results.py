"""The restructured training engine trains exactly what the engine before it trained: same-seed runs of
each objective give bit-identical weights, checkpoints and metrics.

The expected fingerprints (tests/_same_results.py) were recorded by running that module on the code of
commit fd77616 (the engine before objectives and the run state), torch 2.13.0+cpu, CPU capability AVX512
(an Intel Xeon), one thread: ``PYTHONPATH=src:tests python -m _same_results``. Other CPU kinds or torch
builds compute other last bits, so the comparison runs where those match.
"""
import pytest
import torch

from _same_results import run_all

pytestmark = pytest.mark.slow

RECORDED_ON = ("2.13.0+cpu", "AVX512")
EXPECTED = {
    "classification": {"weights": "a7b7f808c06802146890dd99396acd7b9cbf64f5a28ba396f71653ee68f9c489",
                       "checkpoint": "b9b7828732cfc918cf0060612ca597b4b658f5dd36910d278c51d3f9ef7fb324",
                       "metrics": "81fcf158a558ac70812a262bf6372c5dfe00f32f767627deb24083e2494e4a4a",
                       "test_top1": 0.2890625, "test_loss": 1.4543886184692383, "steps": 32},
    "distill_hard_token": {"weights": "6be3d24dfce0beae4516483c28dc281ad1b728ed3a2a50ace7e7e6cc121ceace",
                           "checkpoint": "3ae1758940341bccce5f490a315e986b024acde01869a5dceb87d9520d242166",
                           "metrics": "216eaa859e8983f910053bf94bbd56fdcb2fe934aa0e0a7ed902be60780d2ddf",
                           "test_top1": 0.21875, "test_loss": 1.543775737285614, "teacher_test_top1": 0.2890625,
                           "steps": 32},
    "distill_soft": {"weights": "3b9eddae40baf8ab2ca8610707b8fd1c40b41d40ee8468ae9bd5197316d1213d",
                     "checkpoint": "cc48b565f2975bc8fd55169829a32502e86ba3c65b14d19014c0fcafcc7169e5",
                     "metrics": "cd26d58be3697732130038933e9ed5507fe9ddcb895dfed2991c07bf8b234089",
                     "test_top1": 0.3359375, "test_loss": 1.4470973014831543, "teacher_test_top1": 0.2890625,
                     "steps": 32},
    "mpp": {"weights": "7dbd5431b736e1c9982eacc6d3fa6d2e851c094891bc12d16c3819a36b2da11d",
            "checkpoint": "9fe80589945b3ea33aafe798dcd4c0fc8e8dccc28d6c5ac99a5364c88153aaf3",
            "metrics": "fbe3428e0fe9d69c2ef7d3ae8cbb98a6518a0d4d74657ca3d9ef6d4f1bd8b1b8",
            "val_mpp_loss": 1.4146080017089844, "steps": 32},
    # make demo's recipe (fmnist-demo, real Fashion-MNIST), its first 30 steps, tested on 1,000 test images
    "demo": {"weights": "19d1bbce9f748ed27d9fe38123600c774d09e3162b9607d5674f3a6786364e0f",
             "checkpoint": "ec7d310e8c14ad5c7f48977e56644115d9f3c5fc5193af0e777e58c6beb5fc86",
             "metrics": "101d1f768985d2ebb47919c743934fce3a4b67882fdc0ade4fabe2ea10c556bb",
             "test_top1": 0.466, "test_loss": 1.738225341796875, "steps": 30},
}


def test_same_seed_runs_of_every_objective_match_the_engine_before(tmp_path):
    here = (torch.__version__, torch.backends.cpu.get_cpu_capability())
    if here != RECORDED_ON:
        pytest.skip(f"the fingerprints were recorded with torch/CPU {RECORDED_ON}; this is {here}")
    got = run_all(tmp_path)
    assert got == EXPECTED
