"""Knowledge distillation (vitkit.train.distill): the loss, the teacher's input, the teacher checks."""
import math

import pytest
import torch
import torch.nn.functional as F

from vitkit import VisionTransformer, ViTConfig
from vitkit.checkpoints import save_model
from vitkit.data.augment import EvalTransform, Normalize
from vitkit.train.distill import Distillation, DistillStep, TeacherInput, TwoHeads, distillation_loss, load_teacher
from vitkit.train.recipe import load_recipe
from vitkit.train.step import TrainStep


def test_hard_and_soft_losses_by_hand():
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(8, 5, generator=g), torch.randn(8, 5, generator=g)
    y = torch.randint(0, 5, (8,), generator=g)
    hard = distillation_loss(s, y, t, kind="hard", alpha=0.3)
    by_hand = 0.7 * F.cross_entropy(s, y) + 0.3 * F.cross_entropy(s, t.argmax(1))
    assert torch.allclose(hard, by_hand)
    tau = 2.0
    p_t = (t / tau).softmax(1)
    kl = (p_t * (p_t.log() - (s / tau).log_softmax(1))).sum(1).mean() * tau ** 2
    soft = distillation_loss(s, y, t, kind="soft", alpha=0.5, tau=tau, label_smoothing=0.1)
    assert torch.allclose(soft, 0.5 * F.cross_entropy(s, y, label_smoothing=0.1) + 0.5 * kl, atol=1e-6)
    # alpha 1: the labels do not matter; a student equal to its teacher has no soft teacher term
    assert torch.equal(distillation_loss(s, y, t, alpha=1.0), distillation_loss(s, (y + 1) % 5, t, alpha=1.0))
    assert distillation_loss(t, y, t, kind="soft", alpha=1.0).abs() < 1e-6
    # soft targets (Mixup / CutMix) in the label term
    mixed = F.one_hot(y, 5).float() * 0.6 + F.one_hot((y + 1) % 5, 5).float() * 0.4
    assert torch.allclose(distillation_loss(s, mixed, t, alpha=0.5),
                          0.5 * F.cross_entropy(s, mixed) + 0.5 * F.cross_entropy(s, t.argmax(1)))
    with pytest.raises(ValueError, match="hard or soft"):
        distillation_loss(s, y, t, kind="feature")


def test_the_teacher_gets_the_batch_in_its_own_preprocessing():
    g = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (4, 1, 16, 16), dtype=torch.uint8, generator=g)
    student = Normalize([0.2], [0.3], channels=1)
    teacher = Normalize([0.5, 0.4, 0.3], [0.2, 0.25, 0.3], channels=3)  # an RGB teacher at twice the size
    x = EvalTransform((16, 16), student)(images)
    feed = TeacherInput(student, (16, 16), teacher, (32, 32))
    assert not feed.identity
    assert torch.allclose(feed(x), EvalTransform((32, 32), teacher)(images), atol=1e-5)
    same = TeacherInput(student, (16, 16), Normalize([0.2], [0.3], channels=1), (16, 16))
    assert same.identity and same(x) is x


def _vit(num_classes=4, **kw):
    cfg = dict(img_size=16, patch_size=4, in_chans=1, num_classes=num_classes, width=32, depth=1, num_heads=2,
               mlp_dim=64, class_token=False, pool="gap")
    cfg.update(kw)
    return VisionTransformer(ViTConfig(**cfg))


def test_distill_step_trains_the_student_only():
    """One SGD step on the hard-distillation loss written out by hand; the teacher runs in eval mode (its
    dropout would change its logits otherwise) and stays as it was."""
    import copy

    torch.manual_seed(0)
    student, teacher = _vit(), _vit(dropout=0.5)
    for m in (student, teacher):  # random heads: the paper's zero head gives every student log(4) losses
        torch.nn.init.normal_(m.head.weight, std=0.5)
    before = [p.detach().clone() for p in teacher.parameters()]
    x = torch.randn(6, 1, 16, 16)
    with torch.no_grad():
        t_arg = teacher.eval()(x).argmax(1)
    y = (t_arg + 1) % 4  # labels that disagree with the teacher everywhere: the two terms pull apart
    reference = copy.deepcopy(student)
    expected = 0.5 * F.cross_entropy(reference.train()(x), y) + 0.5 * F.cross_entropy(reference(x), t_arg)
    expected.backward()
    torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)  # TrainStep's default clipping
    with torch.no_grad():
        want = [p - 0.1 * p.grad for p in reference.parameters()]
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
    step = DistillStep(student, opt, teacher=teacher.train(), kind="hard", alpha=0.5)
    stats = step(x, y)
    assert torch.allclose(stats["loss"], expected.detach(), atol=1e-6)
    with torch.no_grad():  # the teacher term counts: the labels alone give another loss
        assert abs(float(expected.detach()) - float(F.cross_entropy(reference(x), y))) > 0.05
    for p, w in zip(student.parameters(), want):  # the student took the step of that loss
        torch.testing.assert_close(p.detach(), w, rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(p, w) for p, w in zip(reference.parameters(), student.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(before, teacher.parameters()))
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())
    assert isinstance(step, TrainStep)


def test_teacher_checks(tmp_path):
    save_model(_vit(num_classes=3), tmp_path / "three")
    with pytest.raises(ValueError, match="predicts 3 classes but the training data has 4"):
        load_teacher(str(tmp_path / "three"), ["a", "b", "c", "d"])
    save_model(_vit(), tmp_path / "named", labels=["a", "b", "d", "c"])
    with pytest.raises(ValueError, match="class 2: teacher 'd', data 'c'"):
        load_teacher(str(tmp_path / "named"), ["a", "b", "c", "d"])
    model, pre = load_teacher(str(tmp_path / "named"), ["a", "b", "d", "c"])
    assert not model.training and model.config.num_classes == 4
    for bad in ({"distill.kind": "feature"}, {"distill.alpha": 0.0}, {"distill.tau": -1.0}):
        with pytest.raises(ValueError, match="distill"):
            load_recipe("fmnist-fast", bad)
    assert math.isclose(load_recipe("fmnist-fast").distill.alpha, 0.5) and load_recipe("deit").distill.teacher is None


def test_a_distillation_token_student_learns_the_teacher_on_its_own_head():
    """DeiT's distillation token: the class head takes the label term, the distillation head the teacher
    term; in eval the model predicts with the mean of the two heads."""
    torch.manual_seed(3)
    student = _vit(class_token=True, pool="token", distill_token=True)
    teacher = _vit()
    torch.nn.init.normal_(teacher.head.weight, std=0.5)
    for head in (student.head, student.head_dist):  # non-zero heads, so the two terms differ
        torch.nn.init.normal_(head.weight, std=0.3)
    opt = torch.optim.SGD(student.parameters(), lr=0.0)
    trained = Distillation(load_recipe("fmnist-fast").distill).wrap(student, None)  # the objective's wrapping
    assert isinstance(trained, TwoHeads) and trained.vit is student
    assert Distillation(load_recipe("fmnist-fast").distill).wrap(teacher, None) is teacher  # one head: itself
    step = DistillStep(trained, opt, teacher=teacher, kind="soft", alpha=0.3, tau=2.0)
    x, y = torch.randn(6, 1, 16, 16), torch.randint(0, 4, (6,))
    with torch.no_grad():
        cls_logits, dist_logits = trained.train()(x)
        torch.testing.assert_close((cls_logits + dist_logits) / 2, student(x))  # the ViT predicts with the mean
        t = teacher(x)
        expected = 0.7 * F.cross_entropy(cls_logits, y) + 0.3 * distillation_loss(dist_logits, y, t, kind="soft",
                                                                                   alpha=1.0, tau=2.0)
        both = distillation_loss(cls_logits, y, t, kind="soft", alpha=0.3, tau=2.0)  # one head takes both terms
        assert not torch.allclose(expected, both)
        mean_right = (((cls_logits + dist_logits) / 2).argmax(1) == y).sum()
    stats = step(x, y)
    assert torch.allclose(stats["loss"], expected, atol=1e-6)
    assert torch.isclose(stats["acc"], mean_right / 6)
    # the loss reaches both heads: the class head through the labels, the distillation head through the teacher
    student.zero_grad()
    step.loss(x, y)[0].backward()
    assert student.head.weight.grad.abs().sum() > 0 and student.head_dist.weight.grad.abs().sum() > 0
    with torch.no_grad():
        assert torch.allclose(student.eval()(x), (cls_logits + dist_logits) / 2, atol=1e-6)


def test_a_missing_teacher_says_how_to_make_it(tmp_path):
    from vitkit.errors import NotFoundError

    with pytest.raises(NotFoundError, match="distill.teacher names no model.*vitkit train -r fmnist-teacher"):
        load_teacher(str(tmp_path / "runs" / "fmnist-teacher" / "model"), ["a", "b"])
