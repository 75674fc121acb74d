"""Softmax cross-entropy, fused with its gradient."""

from __future__ import annotations

from ssdmpi.backend import array_module, is_device_array


def softmax_cross_entropy(logits, labels):
    """Mean cross-entropy over the batch and its gradient with respect to ``logits``.

    Args:
        logits: (batch, classes) float array.
        labels: (batch,) integer class indices.
    Returns:
        ``(loss, dlogits)``: ``loss`` the mean over the batch, as a Python float on NumPy and a
        0-d device array on CuPy (converting it waits for the GPU: the training loop reads the
        losses once per log interval, ``backend.host_floats``); ``dlogits`` the gradient of
        that mean, ``(softmax(logits) - onehot) / batch``.
    """
    xp = array_module(logits)
    n = logits.shape[0]
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = xp.exp(shifted)
    sums = exp.sum(axis=1, keepdims=True)
    rows = xp.arange(n)
    log_prob_true = shifted[rows, labels] - xp.log(sums[:, 0])
    loss = -log_prob_true.mean()
    if not is_device_array(loss):   # free on the host, and callers may rely on a float there
        loss = float(loss)
    dlogits = exp / sums
    dlogits[rows, labels] -= 1
    dlogits /= n
    return loss, dlogits


def cross_entropy_sum_and_correct(logits, labels):
    """``(sum of per-sample losses, number of correct top-1 predictions)`` for evaluation."""
    xp = array_module(logits)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_sums = xp.log(xp.exp(shifted).sum(axis=1))
    rows = xp.arange(logits.shape[0])
    loss_sum = float((log_sums - shifted[rows, labels]).sum())
    correct = int((logits.argmax(axis=1) == labels).sum())
    return loss_sum, correct
