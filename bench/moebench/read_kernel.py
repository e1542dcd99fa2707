"""A read-bandwidth probe written in Triton, the read ceiling beside torch.sum: every program streams
16-byte vectors of a bf16 buffer (grid-stride over blocks) into an fp32 sum and writes its partial
sum out, so the compiler cannot drop a load. Triton is imported only when a CUDA run builds it."""

# (elements per block, warps per program, programs per SM): each keeps ~64 KB of loads in flight per SM,
# well above what HBM's latency needs; the run times all of them and keeps the fastest.
LAUNCHES = ((4096, 4, 8), (8192, 8, 4), (16384, 8, 2))


def build_kernel():
    """The @triton.jit kernel read_sum(x_ptr, partial_ptr, iters, BLOCK): program p reads blocks
    p, p + grid, ..., iters of them (BLOCK contiguous bf16 each: no mask, so the loads stay 16 bytes
    wide), and stores their fp32 sum at partial_ptr[p]."""
    import triton
    import triton.language as tl

    @triton.jit
    def read_sum(x_ptr, partial_ptr, iters, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        offsets = tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for i in range(0, iters):
            block = pid + i * programs
            # int64: a 4 GiB buffer has 2^31 elements; evict_first: each byte is read once
            x = tl.load(x_ptr + block.to(tl.int64) * BLOCK + offsets, eviction_policy="evict_first")
            acc += x.to(tl.float32)
        tl.store(partial_ptr + pid, tl.sum(acc, axis=0))

    return read_sum


class ReadProbe:
    """One launch of the kernel over a bf16 buffer: grid and trip count fixed so that every program reads
    the same number of whole blocks; `bytes` is what one launch reads (the buffer's last
    < grid * BLOCK elements are left out and not counted)."""

    def __init__(self, kernel, x, block, warps, programs_per_sm, sms):
        import torch

        self.kernel, self.x, self.block, self.warps = kernel, x, block, warps
        blocks = x.numel() // block
        self.grid = max(1, min(blocks, programs_per_sm * sms))
        self.iters = blocks // self.grid
        if self.iters < 1:
            raise ValueError(f"buffer of {x.numel()} elements is smaller than one block of {block}")
        self.bytes = self.grid * self.iters * block * x.element_size()
        self.partials = torch.empty(self.grid, dtype=torch.float32, device=x.device)
        self.label = f"BLOCK {block}, {warps} warps, {programs_per_sm} programs/SM"

    def __call__(self):
        self.kernel[(self.grid,)](self.x, self.partials, self.iters, BLOCK=self.block, num_warps=self.warps)
        return self.partials

    def elements_read(self):
        return self.grid * self.iters * self.block


def check_probe(kernel, device, block, warps, programs_per_sm, sms):
    """The kernel's sum of ones equals the number of elements it says it reads (so a fast time is not a
    kernel skipping data); raises otherwise. The buffer holds 3 blocks per program and 5 spare ones."""
    import torch

    grid = max(1, programs_per_sm * sms)
    ones = torch.ones(block * (3 * grid + 5), dtype=torch.bfloat16, device=device)
    probe = ReadProbe(kernel, ones, block, warps, programs_per_sm, sms)
    total = probe().sum(dtype=torch.float64).item()
    if total != probe.elements_read():
        raise RuntimeError(f"Triton read kernel ({probe.label}) summed {total:.0f} ones, expected "
                           f"{probe.elements_read()}")
