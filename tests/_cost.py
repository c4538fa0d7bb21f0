"""The cost model's check shared by the model tests: MACs against torch's FLOP counter, parameters against the
built model."""
import torch
from torch.utils.flop_counter import FlopCounterMode

import vitkit
from vitkit.models.cost import cost, param_count


def assert_cost_matches_flop_counter(cfg) -> None:
    """vitkit's cost model against torch's FLOP counter on one forward pass (attention maps included), and its
    parameter count against the built model's."""
    model = vitkit.VisionTransformer(cfg).eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.randn(1, cfg.in_chans, *cfg.img_size), return_attention=True)
    c = cost(cfg)
    assert counter.get_total_flops() == 2 * c.macs and c.macs_breakdown["backbone"] > 0
    assert param_count(cfg) == model.num_params()
