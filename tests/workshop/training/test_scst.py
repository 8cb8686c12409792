import numpy as np
import pytest
import torch

from edgecap.workshop.evaluation.cider import CiderD
from edgecap.workshop.training.rewards import EOS_WORD, CaptionReward, sentence_bleu4
from edgecap.workshop.training.scst import advantages, greedy_baseline, leave_one_out_baseline, scst_loss


def test_leave_one_out_baseline_on_hand_made_numbers():
    rewards = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0], [0.0, 0.0, 0.0, 0.0, 10.0]])
    base = leave_one_out_baseline(rewards)
    # image 0: (15 - r) / 4; image 1: (10 - r) / 4
    expected = torch.tensor([[3.5, 3.25, 3.0, 2.75, 2.5], [2.5, 2.5, 2.5, 2.5, 0.0]])
    torch.testing.assert_close(base, expected)
    adv = advantages(rewards, "loo")
    torch.testing.assert_close(adv, torch.tensor([[-2.5, -1.25, 0.0, 1.25, 2.5], [-2.5, -2.5, -2.5, -2.5, 10.0]]))
    # The leave-one-out advantages of an image sum to zero (the baseline is unbiased and centred).
    torch.testing.assert_close(adv.sum(dim=1), torch.zeros(2))


def test_leave_one_out_needs_two_samples():
    with pytest.raises(ValueError, match="at least 2 samples"):
        leave_one_out_baseline(torch.ones(3, 1))


def test_greedy_baseline_broadcasts_the_greedy_reward():
    rewards = torch.tensor([[1.0, 3.0], [2.0, 2.0]])
    greedy = torch.tensor([2.0, 0.5])
    torch.testing.assert_close(greedy_baseline(rewards, greedy), torch.tensor([[2.0, 2.0], [0.5, 0.5]]))
    torch.testing.assert_close(advantages(rewards, "greedy", greedy), torch.tensor([[-1.0, 1.0], [1.5, 1.5]]))
    with pytest.raises(ValueError, match="greedy captions"):
        advantages(rewards, "greedy")
    with pytest.raises(ValueError, match="unknown SCST baseline"):
        advantages(rewards, "mean")


def test_loss_signs_on_a_hand_made_reward_table():
    # Two samples of one image: the better one (reward 3) must be pushed up, the worse (reward 1) down.
    logits = torch.zeros(2, 3, requires_grad=True)
    token_lp = torch.nn.functional.logsigmoid(logits)  # (2, 3), each token log p = log 0.5
    mask = torch.tensor([[True, True, False], [True, True, True]])
    adv = advantages(torch.tensor([[3.0, 1.0]]), "loo").reshape(-1)  # [+2, -2]
    loss = scst_loss(token_lp, mask, adv, norm="sequence")
    # sequence norm: -(sum over samples of advantage * summed log p) / number of samples
    lp = float(np.log(0.5))
    assert float(loss.detach()) == pytest.approx(-(2.0 * 2 * lp - 2.0 * 3 * lp) / 2)
    loss.backward()
    grad = logits.grad
    # gradient descent moves logits by -grad: up on the good sample's tokens, down on the bad one's, 0 on padding
    assert (grad[0, :2] < 0).all() and (grad[1] > 0).all() and grad[0, 2] == 0
    token = scst_loss(token_lp.detach(), mask, adv, norm="token")
    assert float(token) == pytest.approx(-(2.0 * 2 * lp - 2.0 * 3 * lp) / 5)
    # A zero advantage contributes nothing.
    assert float(scst_loss(token_lp.detach(), mask, torch.zeros(2))) == 0.0
    with pytest.raises(ValueError, match="normalisation"):
        scst_loss(token_lp, mask, adv, norm="batch")


def test_reward_uses_training_document_frequencies():
    train_refs = [
        [["a", "dog", "runs"], ["a", "dog", "is", "running"]],
        [["a", "cat", "sleeps"], ["a", "cat", "is", "sleeping"]],
        [["a", "red", "car"], ["a", "car", "parked"]],
    ]
    reward = CaptionReward(train_refs)
    assert reward.cider.num_documents == 3
    refs = reward.references(train_refs[0])
    cands = [["a", "dog", "runs"], ["a", "cat", "sleeps"]]
    got = reward(cands, [refs, refs])
    expected = CiderD(train_refs).score(cands, [train_refs[0], train_refs[0]])
    np.testing.assert_allclose(got, expected)
    assert got[0] > got[1] > -1e-12
    # "a" occurs in every training image: its IDF is log(3) - log(3) = 0, so a caption of only "a" scores 0.
    assert reward([["a"]], [refs])[0] == pytest.approx(0.0)


def test_reward_bleu_weight_and_eos_word():
    train_refs = [[["a", "dog", "runs", "fast"]], [["a", "cat", "sleeps", "here"]]]
    plain = CaptionReward(train_refs)
    mixed = CaptionReward(train_refs, bleu_weight=1.0)
    refs = [["a", "dog", "runs", "fast"]]
    cand = [["a", "dog", "runs", "fast"]]
    bleu = sentence_bleu4(cand, [refs])
    assert bleu[0] == pytest.approx(1.0, abs=1e-6)
    assert mixed(cand, [refs])[0] == pytest.approx(plain(cand, [refs])[0] + bleu[0])
    with_eos = CaptionReward(train_refs, eos_word=True)
    assert with_eos.references(refs) == [["a", "dog", "runs", "fast", EOS_WORD]]
    assert with_eos.candidate(["a", "dog"], finished=True) == ["a", "dog", EOS_WORD]
    assert with_eos.candidate(["a", "dog"], finished=False) == ["a", "dog"]
    with pytest.raises(ValueError, match="weights"):
        CaptionReward(train_refs, bleu_weight=0.0, cider_weight=0.0)
