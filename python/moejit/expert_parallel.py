"""Expert parallel across ranks through torch.distributed (NCCL on GPUs, gloo on CPUs).

A layer whose config has ep_size > 1 (or tp_size > 1) computes its rank's part only; the two modes
here finish the layer over the ranks of a process group, so that every rank gets the whole output:

  all_reduce  every rank holds the same tokens; each computes its local experts (its slice of I
              under tensor parallel) and an all-reduce sums the ranks' outputs. The residual is added
              on the group's rank 0 only, so it is counted once. Group size ep_size * tp_size, every
              (ep_rank, tp_rank) exactly once (checked when the layer is built).
  all_to_all  every rank holds its own tokens (T may differ by rank). A rank routes its tokens,
              sends each token's hidden row once to every rank that holds one of its experts (with
              the token's top-k ids and weights), runs its local experts on what it received, sends
              the weighted sums back, and adds each token's returns in rank order. Group size
              ep_size, group rank == ep_rank, tp_size 1. Two ways to size the exchange:
                max_tokens_per_rank = C  slabs of a fixed capacity, C rows per pair of ranks (a token
                    goes to a rank at most once, so no routing overflows them): the counts stay on the
                    device, no host synchronization, CUDA-graph capturable. Rows past a rank's tokens
                    carry weight 0 and expert ids -1, which select no expert, so no GEMM computes them,
                    but every rank sends ep_size x C rows each way whatever the routing (DeepEP's
                    low-latency kernels make the same trade): for decode within a node.
                max_tokens_per_rank = None  splits that follow the routing: the ranks first exchange
                    their counts and the host reads them (a synchronization per call, no CUDA graph),
                    then each row crosses once: for prefill, and for groups past one node, where the
                    fixed slabs would send ep_size / (distinct ranks per token) times the bytes.
The sums are in a fixed order (rank 0 first), so a call is bitwise reproducible run to run. fp8 layers
send the rows quantized (e4m3 bytes and their scales, by the layer's own stage-3 rule: what the
receiving rank would have quantized itself), about half the bytes of bf16; the sums return in the
model dtype.

Both modes run the moejit ops of their device (the CPU kernels on CPU tensors), so the same code is
tested with gloo on CPUs (tests/python/test_expert_parallel.py) and runs with NCCL on GPUs.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
import torch.distributed as dist

__all__ = ["MODES", "check_group", "all_reduce_output", "dispatch_combine"]

MODES = ("all_reduce", "all_to_all")


def check_group(config, group, mode: str, max_tokens_per_rank: Optional[int]) -> None:
    """Raises ValueError naming what does not fit: the mode, the group's size and ranks against
    the config's ep_size / ep_rank / tp_size / tp_rank, the capacity. A collective: every rank of
    the group must build its layer, and every rank raises when any rank's layer does not fit (so
    that none goes on to wait in an exchange the others never join)."""
    if mode not in MODES:
        raise ValueError(f"moejit: ep_mode {mode!r} is not supported; allowed: {', '.join(MODES)}")
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("moejit: process_group is given, but torch.distributed is not initialized "
                         "(call torch.distributed.init_process_group first)")
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    mine = _problem(config, size, rank, mode, max_tokens_per_rank)
    facts = [None] * size
    dist.all_gather_object(facts, (mine, config.ep_rank, config.tp_rank, max_tokens_per_rank), group=group)
    if mine:
        raise ValueError(f"moejit: {mine}")
    others = [f"rank {r}: {fact[0]}" for r, fact in enumerate(facts) if fact[0]]
    if others:
        raise ValueError(f"moejit: the layer does not fit the process group on other ranks ({'; '.join(others)})")
    if mode == "all_reduce":
        places = sorted((fact[1], fact[2]) for fact in facts)
        expected = sorted((e, t) for e in range(config.ep_size) for t in range(config.tp_size))
        if places != expected:
            raise ValueError(f"moejit: the group's ranks hold (ep_rank, tp_rank) = {[f[1:3] for f in facts]}; ep_mode "
                             f"all_reduce needs each of {expected} exactly once")
    else:
        capacities = [fact[3] for fact in facts]
        # The slabs of an exchange line up only if every rank cuts them alike.
        if len(set(capacities)) != 1:
            raise ValueError(f"moejit: the group's ranks give max_tokens_per_rank {capacities}; ep_mode all_to_all "
                             "needs the same value on every rank")


def _problem(config, size: int, rank: int, mode: str, capacity) -> Optional[str]:
    """Why this rank's layer does not fit the group (None: it does)."""
    if mode == "all_reduce":
        want = config.ep_size * config.tp_size
        if size != want:
            return (f"process_group has {size} ranks; ep_mode all_reduce sums the outputs of ep_size * tp_size = "
                    f"{config.ep_size} * {config.tp_size} = {want} ranks")
        return None
    if config.tp_size != 1:
        return (f"ep_mode all_to_all needs tp_size 1 (got {config.tp_size}): a token's row goes to the one rank "
                "that holds each of its experts whole; use all_reduce")
    if size != config.ep_size:
        return f"process_group has {size} ranks; ep_mode all_to_all needs ep_size = {config.ep_size} (a rank per expert slice)"
    if rank != config.ep_rank:
        return (f"this process is rank {rank} of process_group but its config has ep_rank {config.ep_rank}; ep_mode "
                "all_to_all sends expert e's pairs to group rank e // local_experts, so the two must be equal")
    if config.router_gemm:
        return ("ep_mode all_to_all routes before the dispatch from router_logits; router_gemm layers are not "
                "supported there yet (use all_reduce)")
    if config.fuse_shared_experts:
        return ("ep_mode all_to_all does not run fused shared experts yet (set fuse_shared_experts false and run "
                "them beside the layer, or use all_reduce)")
    if capacity is not None and (not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0):
        return (f"ep_mode all_to_all takes max_tokens_per_rank, a positive int (the rows each rank may send to each "
                f"other rank per call), or None (splits that follow the routing); got {capacity!r}")
    return None


def all_reduce_output(output: torch.Tensor, group) -> torch.Tensor:
    """Sums `output` over the group's ranks, in place (NCCL on the current stream, or gloo)."""
    with _naming_failures("all_reduce", "the all-reduce of the layer's output", group):
        dist.all_reduce(output, op=dist.ReduceOp.SUM, group=group)
    return output


@contextlib.contextmanager
def _naming_failures(mode: str, what: str, group):
    """Re-raises a collective's failure (a dead rank, a timeout) as one that says which exchange of
    which mode failed. (NCCL may report a dead peer only at its timeout, through its watchdog.)"""
    try:
        yield
    except RuntimeError as e:
        raise RuntimeError(f"moejit: ep_mode {mode}: {what} over the process group ({dist.get_world_size(group)} "
                           f"ranks) failed; a rank may have died or timed out: {e}") from e


def dispatch_combine(layer, hidden: torch.Tensor, router_logits: torch.Tensor, residual: Optional[torch.Tensor],
                     group, capacity: Optional[int]) -> torch.Tensor:
    """The all_to_all mode of one call (see the module's docstring); `layer` is the MoELayer."""
    config = layer.config
    ranks, T = config.ep_size, hidden.shape[0]
    if capacity is not None and T > capacity:
        # This rank still serves the others' rows (sending none of its own), so that their call
        # completes and the group's exchanges stay paired; then it raises.
        dispatch_combine(layer, hidden[:0], router_logits[:0], None, group, capacity)
        raise ValueError(f"moejit: {T} tokens on this rank, more than max_tokens_per_rank = {capacity}; this "
                         "call computed nothing for them (the other ranks' calls completed)")
    device = hidden.device
    topk_weights, topk_ids = layer.route(router_logits)  # [T, K] fp32, [T, K] int32 (global experts)
    # goes[t, r]: token t has an expert on rank r (it is sent there once).
    goes = torch.zeros(T, ranks, dtype=torch.bool, device=device)
    goes.scatter_(1, topk_ids.long() // config.local_experts, True)
    # source: the token each send row carries, rank 0's rows first, then rank 1's, ...; T marks an
    # unused row of a fixed slab. sent / received: rows to and from each rank.
    if capacity is None:
        # Splits that follow the routing: nonzero and the count exchange read on the host.
        to_rank = [torch.nonzero(goes[:, r]).squeeze(1) for r in range(ranks)]
        sent = [int(t.numel()) for t in to_rank]
        source = torch.cat(to_rank)
        with _naming_failures("all_to_all", "the exchange of the row counts", group):
            counts = torch.tensor(sent, dtype=torch.int64, device=device)
            arrived = torch.empty_like(counts)
            dist.all_to_all_single(arrived, counts, group=group)
        received = arrived.tolist()
    else:
        # Fixed slabs: token t's row for rank r is slab r's row (its place among r's tokens); the
        # counts never leave the device. Rows not sent point at a spare row past the end.
        slot = torch.cumsum(goes.to(torch.int32), dim=0) - 1
        spare = ranks * capacity
        row = torch.where(goes, torch.arange(ranks, device=device) * capacity + slot, torch.full_like(slot, spare))
        source = torch.full((spare + 1,), T, dtype=torch.long, device=device)
        tokens = torch.arange(T, device=device)
        for r in range(ranks):  # (only the spare row, dropped, is written twice)
            source.index_copy_(0, row[:, r].long(), tokens)
        source = source[:spare]
        sent = received = [capacity] * ranks
    return _exchange_and_combine(layer, hidden, topk_ids, topk_weights, residual, source, sent, received, group)


def _exchange_and_combine(layer, hidden, topk_ids, topk_weights, residual, source, sent, received, group):
    """Sends row j (token source[j]; T: an unused row of zeros, weight 0 and ids -1, which select no
    expert, so no GEMM works on it) to its rank by the splits, runs this rank's experts on what
    arrived (other ranks' experts in a row's ids contribute 0), returns the sums the same way back,
    and adds each token's returns to its residual in rank order, in fp32."""
    T, H = hidden.shape[0], layer.config.hidden

    def exchange(send, in_splits, out_splits, what):
        recv = send.new_empty((sum(out_splits),) + tuple(send.shape[1:]))
        with _naming_failures("all_to_all", what, group):
            dist.all_to_all_single(recv, send.contiguous(), out_splits, in_splits, group=group)
        return recv

    def rows(t, fill):
        return torch.cat([t, t.new_full((1,) + tuple(t.shape[1:]), fill)]).index_select(0, source)

    recv_ids = exchange(rows(topk_ids, -1), sent, received, "the dispatch of the tokens' top-k ids")
    recv_weights = exchange(rows(topk_weights, 0), sent, received, "the dispatch of the tokens' top-k weights")
    if layer.config.quant in ("fp8_block", "fp8_tensor"):
        # The rows travel quantized: e4m3 bytes (as uint8, which every backend moves) and their scales.
        q, scale = layer.quantize_hidden(hidden)
        recv_q = exchange(rows(q.view(torch.uint8), 0), sent, received, "the dispatch of the tokens' fp8 rows")
        recv_scale = exchange(rows(scale, 0), sent, received, "the dispatch of the tokens' fp8 row scales")
        partial = layer.experts_only(recv_q.view(torch.float8_e4m3fn), recv_ids, recv_weights, hidden_scale=recv_scale)
    else:
        recv_hidden = exchange(rows(hidden, 0), sent, received, "the dispatch of the tokens' rows")
        partial = layer.experts_only(recv_hidden, recv_ids, recv_weights)
    returned = exchange(partial, received, sent, "the combine's return of the experts' sums").float()
    # Row T collects the unused rows' returns (zeros) and is dropped; within one rank's rows a
    # token appears once, so each rank's returns are one add per token.
    out = torch.zeros(T + 1, H, dtype=torch.float32, device=hidden.device)
    if residual is not None:
        out[:T] += residual.float()
    start = 0
    for r in range(len(sent)):
        out.index_add_(0, source[start:start + sent[r]], returned[start:start + sent[r]])
        start += sent[r]
    return out[:T].to(hidden.dtype)
