"""Recorded wrong answers for solutions/09_efficiency.ipynb (format: m11_helpers/grading/authoring/wrong_answers.py)."""

# %% 9.1 | adds the sums and outputs without re-basing them on the common max | expect: re-base each sum
def merge_states(a, b):
    (m_a, l_a, o_a), (m_b, l_b, o_b) = a, b
    return torch.maximum(m_a, m_b), l_a + l_b, o_a + o_b

# %% 9.1 | re-bases the sums but not the outputs | expect: the same factors as the sums
def merge_states(a, b):
    (m_a, l_a, o_a), (m_b, l_b, o_b) = a, b
    m = torch.maximum(m_a, m_b)
    return m, torch.exp(m_a - m) * l_a + torch.exp(m_b - m) * l_b, o_a + o_b

# %% 9.1 | keeps the first state's max (re-bases b onto it) | expect: the max over both key sets
def merge_states(a, b):
    (m_a, l_a, o_a), (m_b, l_b, o_b) = a, b
    w = torch.exp(m_b - m_a)
    return m_a, l_a + w * l_b, o_a + w * o_b

# %% 9.1 | the merge of the formula, unguarded: NaN when both states are empty (−inf − (−inf)) | expect: e^(−inf + inf) = NaN
def merge_states(a, b):
    (m_a, l_a, o_a), (m_b, l_b, o_b) = a, b
    m = torch.maximum(m_a, m_b)
    w_a, w_b = torch.exp(m_a - m), torch.exp(m_b - m)
    return m, w_a * l_a + w_b * l_b, w_a * o_a + w_b * o_b

# %% 9.1 | re-bases with the factor upside down, e^(m − m_a) | expect: re-base each sum
def merge_states(a, b):
    (m_a, l_a, o_a), (m_b, l_b, o_b) = a, b
    m = torch.maximum(m_a, m_b)
    w_a, w_b = torch.exp(m - m_a), torch.exp(m - m_b)
    return m, w_a * l_a + w_b * l_b, w_a * o_a + w_b * o_b

# %% 9.1 | delegates to the lesson's online_softmax_update (b's state as one pseudo-score) | expect: write the merge yourself
from m11_helpers.attention import online_softmax_update


def merge_states(a, b):
    (m_a, l_a, o_a), (m_b, l_b, o_b) = a, b
    return online_softmax_update(m_a, l_a, o_a, m_b + torch.log(l_b), o_b / l_b)  # b as one key: wrong m, and forbidden

# %% 9.2 | calls F.scaled_dot_product_attention (the exercise is to write it) | expect: write the tiles yourself
def my_tiled_attention(q, k, v, block, causal=False):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

# %% 9.2 | calls the fused CPU kernel through torch.ops (around the forbidden function) | expect: library attention kernel
def my_tiled_attention(q, k, v, block, causal=False):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=causal)[0]

# %% 9.2 | one (block × T) strip of scores per query block: still the s² matrix, in strips | expect: tile by tile
def my_tiled_attention(q, k, v, block, causal=False):
    T, D = q.shape[-2], q.shape[-1]
    outs = []
    for i0 in range(0, T, block):
        s = q[..., i0:i0 + block, :] @ k.transpose(-2, -1) / math.sqrt(D)  # (B, H, Bq, T)
        if causal:
            rows = s.shape[-2]
            s = s.masked_fill(torch.arange(T)[None, :] > torch.arange(i0, i0 + rows)[:, None], -math.inf)
        outs.append(s.softmax(-1) @ v)
    return torch.cat(outs, dim=-2)

# %% 9.2 | forgets the 1/√D scale | expect: 1/√D
def my_tiled_attention(q, k, v, block, causal=False):
    T = q.shape[-2]
    outs = []
    for i0 in range(0, T, block):
        qi = q[..., i0:i0 + block, :]
        rows = qi.shape[-2]
        m = qi.new_full((*qi.shape[:-1], 1), -math.inf)
        l, o = qi.new_zeros((*qi.shape[:-1], 1)), torch.zeros_like(qi)
        for j0 in range(0, i0 + rows if causal else T, block):
            kj, vj = k[..., j0:j0 + block, :], v[..., j0:j0 + block, :]
            s = qi @ kj.transpose(-2, -1)
            if causal:
                s = s.masked_fill(torch.arange(j0, j0 + kj.shape[-2])[None, :] > torch.arange(i0, i0 + rows)[:, None],
                                  -math.inf)
            m_t = s.amax(dim=-1, keepdim=True)
            p = torch.exp(s - m_t)
            m, l, o = merge_states((m, l, o), (m_t, p.sum(dim=-1, keepdim=True), p @ vj))
        outs.append(o / l)
    return torch.cat(outs, dim=-2)

# %% 9.2 | a softmax per tile, summed (no running max and sum across tiles) | expect: a softmax per tile
def my_tiled_attention(q, k, v, block, causal=False):
    T, D = q.shape[-2], q.shape[-1]
    outs = []
    for i0 in range(0, T, block):
        qi = q[..., i0:i0 + block, :] / math.sqrt(D)
        rows = qi.shape[-2]
        o = torch.zeros_like(qi)
        tiles = 0
        for j0 in range(0, i0 + rows if causal else T, block):
            kj, vj = k[..., j0:j0 + block, :], v[..., j0:j0 + block, :]
            s = qi @ kj.transpose(-2, -1)
            if causal:
                s = s.masked_fill(torch.arange(j0, j0 + kj.shape[-2])[None, :] > torch.arange(i0, i0 + rows)[:, None],
                                  -math.inf)
            o = o + torch.nan_to_num(s.softmax(-1)) @ vj
            tiles += 1
        outs.append(o / tiles)
    return torch.cat(outs, dim=-2)

# %% 9.2 | no running max: sums exp of the raw scores (exact in float64, overflows float32) | expect: running max
def my_tiled_attention(q, k, v, block, causal=False):
    T, D = q.shape[-2], q.shape[-1]
    outs = []
    for i0 in range(0, T, block):
        qi = q[..., i0:i0 + block, :] / math.sqrt(D)
        rows = qi.shape[-2]
        l, o = qi.new_zeros((*qi.shape[:-1], 1)), torch.zeros_like(qi)
        for j0 in range(0, i0 + rows if causal else T, block):
            kj, vj = k[..., j0:j0 + block, :], v[..., j0:j0 + block, :]
            s = qi @ kj.transpose(-2, -1)
            if causal:
                s = s.masked_fill(torch.arange(j0, j0 + kj.shape[-2])[None, :] > torch.arange(i0, i0 + rows)[:, None],
                                  -math.inf)
            p = torch.exp(s)  # no max subtracted: e^s overflows once a score passes ~88.7 in float32
            l, o = l + p.sum(dim=-1, keepdim=True), o + p @ vj
        outs.append(o / l)
    return torch.cat(outs, dim=-2)

# %% 9.2 | masks the diagonal too (j < i instead of j ≤ i) | expect: j ≤ i
def my_tiled_attention(q, k, v, block, causal=False):
    T, D = q.shape[-2], q.shape[-1]
    outs = []
    for i0 in range(0, T, block):
        qi = q[..., i0:i0 + block, :] / math.sqrt(D)
        rows = qi.shape[-2]
        m = qi.new_full((*qi.shape[:-1], 1), -math.inf)
        l, o = qi.new_zeros((*qi.shape[:-1], 1)), torch.zeros_like(qi)
        for j0 in range(0, i0 + rows if causal else T, block):
            kj, vj = k[..., j0:j0 + block, :], v[..., j0:j0 + block, :]
            s = qi @ kj.transpose(-2, -1)
            if causal:
                s = s.masked_fill(torch.arange(j0, j0 + kj.shape[-2])[None, :] >= torch.arange(i0, i0 + rows)[:, None],
                                  -math.inf)
            m_t = s.amax(dim=-1, keepdim=True)
            p = torch.exp(s - m_t)
            m, l, o = merge_states((m, l, o), (m_t, p.sum(dim=-1, keepdim=True), p @ vj))
        outs.append(o / l)
    return torch.cat(outs, dim=-2)

# %% 9.2 | masks with a full-block mask, which breaks on a shorter last tile | expect: last tile is shorter
def my_tiled_attention(q, k, v, block, causal=False):
    T, D = q.shape[-2], q.shape[-1]
    outs = []
    for i0 in range(0, T, block):
        qi = q[..., i0:i0 + block, :] / math.sqrt(D)
        m = qi.new_full((*qi.shape[:-1], 1), -math.inf)
        l, o = qi.new_zeros((*qi.shape[:-1], 1)), torch.zeros_like(qi)
        for j0 in range(0, i0 + block if causal else T, block):
            kj, vj = k[..., j0:j0 + block, :], v[..., j0:j0 + block, :]
            s = qi @ kj.transpose(-2, -1)
            if causal:
                s = s.masked_fill(torch.arange(j0, j0 + block)[None, :] > torch.arange(i0, i0 + block)[:, None],
                                  -math.inf)
            m_t = s.amax(dim=-1, keepdim=True)
            p = torch.exp(s - m_t)
            m, l, o = merge_states((m, l, o), (m_t, p.sum(dim=-1, keepdim=True), p @ vj))
        outs.append(o / l)
    return torch.cat(outs, dim=-2)

# %% 9.2 | two passes over each row's tiles, all kept for the second: exact, no tile too large, but a (block × T) strip held in pieces | expect: second pass
def my_tiled_attention(q, k, v, block, causal=False):
    T, D = q.shape[-2], q.shape[-1]
    outs = []
    for i0 in range(0, T, block):
        qi = q[..., i0:i0 + block, :] / math.sqrt(D)
        rows = qi.shape[-2]
        tiles = []  # pass 1 keeps every score tile of the row to find its max
        for j0 in range(0, i0 + rows if causal else T, block):
            s = qi @ k[..., j0:j0 + block, :].transpose(-2, -1)
            if causal:
                s = s.masked_fill(torch.arange(j0, j0 + s.shape[-1])[None, :] > torch.arange(i0, i0 + rows)[:, None],
                                  -math.inf)
            tiles.append((j0, s))
        m = torch.stack([s.amax(dim=-1, keepdim=True) for _, s in tiles]).amax(dim=0)
        l = sum(torch.exp(s - m).sum(dim=-1, keepdim=True) for _, s in tiles)  # pass 2: exp and sum
        o = sum(torch.exp(s - m) @ v[..., j0:j0 + block, :] for j0, s in tiles)
        outs.append(o / l)
    return torch.cat(outs, dim=-2)

# %% 9.3 | adds up the member kernels' traffic (fusion saves nothing) | expect: stay in registers
def fused_traffic(graph, groups):
    total = 0
    for g in groups:
        for k in g:
            kern = graph.kernels[k]
            total += sum(graph.nbytes[n] for n in kern.reads) + sum(graph.nbytes[n] for n in kern.writes)
    return total

# %% 9.3 | reads an input once per kernel that uses it, not once per fused kernel | expect: reads each input once
def fused_traffic(graph, groups):
    group_of = {k: gi for gi, g in enumerate(groups) for k in g}
    readers = {}
    for k, kern in enumerate(graph.kernels):
        for name in kern.reads:
            readers.setdefault(name, set()).add(group_of[k])
    total = 0
    for gi, g in enumerate(groups):
        made = {n for k in g for n in graph.kernels[k].writes}
        total += sum(graph.nbytes[n] for k in g for n in graph.kernels[k].reads if n not in made)
        stays = {n for n in made if readers.get(n) == {gi} and n not in graph.outputs}
        total += sum(graph.nbytes[n] for n in made - stays)
    return total

# %% 9.3 | writes only what the function returns (intermediates a later kernel reads are never written) | expect: writes its results to memory
def fused_traffic(graph, groups):
    total = 0
    for g in groups:
        made = {n for k in g for n in graph.kernels[k].writes}
        needed = {n for k in g for n in graph.kernels[k].reads} - made
        total += sum(graph.nbytes[n] for n in needed) + sum(graph.nbytes[n] for n in made if n in graph.outputs)
    return total

# %% 9.3 | reads each tensor once in the whole plan, however many groups need it | expect: even if an earlier kernel read them
def fused_traffic(graph, groups):
    group_of = {k: gi for gi, g in enumerate(groups) for k in g}
    readers = {}
    for k, kern in enumerate(graph.kernels):
        for name in kern.reads:
            readers.setdefault(name, set()).add(group_of[k])
    total, seen = 0, set()
    for gi, g in enumerate(groups):
        made = {n for k in g for n in graph.kernels[k].writes}
        needed = {n for k in g for n in graph.kernels[k].reads} - made - seen
        seen |= needed | made
        stays = {n for n in made if readers.get(n) == {gi} and n not in graph.outputs}
        total += sum(graph.nbytes[n] for n in needed | (made - stays))
    return total

# %% 9.3 | delegates to fusion.group_traffic | expect: yourself
def fused_traffic(graph, groups):
    return fusion.group_traffic(graph, groups)

# %% 9.4 | adds up event durations (nested ops counted twice) | expect: never add durations
def step_split(events):
    steps = [e for e in events if e.name == "train_step"]
    wall = sum(e.end - e.start for e in steps)
    comm = sum(e.end - e.start for e in events if is_comm(e.name))
    compute = sum(e.end - e.start for e in events
                  if e.thread == steps[0].thread and e.name.startswith("aten::") and not is_comm(e.name))
    return {"wall": wall, "comm": comm, "compute": compute, "other": wall - comm - compute}

# %% 9.4 | counts communication on the training thread only (misses gloo's threads) | expect: every thread
def step_split(events):
    def union(intervals):
        total, end = 0.0, -math.inf
        for s, e in sorted(intervals):
            if e > end:
                total += e - max(s, end)
                end = e
        return total

    steps = [e for e in events if e.name == "train_step"]
    main, windows = steps[0].thread, [(e.start, e.end) for e in steps]
    inside = lambda iv: [(max(s, a), min(e, b)) for s, e in iv for a, b in windows if min(e, b) > max(s, a)]
    comm = inside([(e.start, e.end) for e in events if is_comm(e.name) and e.thread == main])
    compute = inside([(e.start, e.end) for e in events
                      if e.thread == main and e.name.startswith("aten::") and not is_comm(e.name)])
    wall, comm_t, busy = union(windows), union(comm), union(comm + compute)
    return {"wall": wall, "comm": comm_t, "compute": busy - comm_t, "other": wall - busy}

# %% 9.4 | counts compute that overlaps a collective twice | expect: counts as communication
def step_split(events):
    def union(intervals):
        total, end = 0.0, -math.inf
        for s, e in sorted(intervals):
            if e > end:
                total += e - max(s, end)
                end = e
        return total

    steps = [e for e in events if e.name == "train_step"]
    main, windows = steps[0].thread, [(e.start, e.end) for e in steps]
    inside = lambda iv: [(max(s, a), min(e, b)) for s, e in iv for a, b in windows if min(e, b) > max(s, a)]
    comm = union(inside([(e.start, e.end) for e in events if is_comm(e.name)]))
    compute = union(inside([(e.start, e.end) for e in events
                            if e.thread == main and e.name.startswith("aten::") and not is_comm(e.name)]))
    wall = union(windows)
    return {"wall": wall, "comm": comm, "compute": compute, "other": wall - comm - compute}

# %% 9.4 | does not clip events to the train_step windows | expect: inside the train_step windows
def step_split(events):
    def union(intervals):
        total, end = 0.0, -math.inf
        for s, e in sorted(intervals):
            if e > end:
                total += e - max(s, end)
                end = e
        return total

    steps = [e for e in events if e.name == "train_step"]
    main = steps[0].thread
    comm = [(e.start, e.end) for e in events if is_comm(e.name)]
    compute = [(e.start, e.end) for e in events
               if e.thread == main and e.name.startswith("aten::") and not is_comm(e.name)]
    wall, comm_t, busy = union([(e.start, e.end) for e in steps]), union(comm), union(comm + compute)
    return {"wall": wall, "comm": comm_t, "compute": busy - comm_t, "other": wall - busy}

# %% 9.4 | delegates to profiling.split_events | expect: split the events yourself
def step_split(events):
    return profiling.split_events(events)

# %% 9.5 | materialises the full P in backward (S = QKᵀ/√d for the whole sequence, then exp(S − L)) | expect: one (block × block) tile at a time
class MyFlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, block, causal):
        o, lse = attention.tiled_attention(q, k, v, block, block, causal, return_lse=True)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal = causal
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        T, scale = q.shape[-2], 1.0 / math.sqrt(q.shape[-1])
        p = torch.exp(q @ k.transpose(-2, -1) * scale - lse)  # (B, H, T, T): exact, and the whole matrix
        if ctx.causal:
            p = p.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), 0.0)
        ds = p * (do @ v.transpose(-2, -1) - (do * o).sum(-1, keepdim=True)) * scale
        return ds @ k, ds.transpose(-2, -1) @ q, p.transpose(-2, -1) @ do, None, None

# %% 9.5 | saves P's tiles in forward instead of recomputing them in backward | expect: recompute each tile of P in backward
class MyFlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, block, causal):
        o, lse = attention.tiled_attention(q, k, v, block, block, causal, return_lse=True)
        T, scale = q.shape[-2], 1.0 / math.sqrt(q.shape[-1])
        ctx.tiles = {}  # (i0, j0) -> P tile, kept for backward: no recomputation
        for i0 in range(0, T, block):
            for j0 in range(0, i0 + block if causal else T, block):
                p = torch.exp(q[..., i0:i0 + block, :] @ k[..., j0:j0 + block, :].transpose(-2, -1) * scale
                              - lse[..., i0:i0 + block, :])
                if causal:
                    p = p.masked_fill(torch.arange(j0, j0 + p.shape[-1])[None, :]
                                      > torch.arange(i0, i0 + p.shape[-2])[:, None], 0.0)
                ctx.tiles[i0, j0] = p
        ctx.save_for_backward(q, k, v, o)
        ctx.block = block
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o = ctx.saved_tensors
        scale, b = 1.0 / math.sqrt(q.shape[-1]), ctx.block
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        delta = (do * o).sum(dim=-1, keepdim=True)
        for (i0, j0), p in ctx.tiles.items():
            doi = do[..., i0:i0 + b, :]
            dv[..., j0:j0 + b, :] += p.transpose(-2, -1) @ doi
            ds = p * (doi @ v[..., j0:j0 + b, :].transpose(-2, -1) - delta[..., i0:i0 + b, :]) * scale
            dq[..., i0:i0 + b, :] += ds @ k[..., j0:j0 + b, :]
            dk[..., j0:j0 + b, :] += ds.transpose(-2, -1) @ q[..., i0:i0 + b, :]
        return dq, dk, dv, None, None

# %% 9.5 | D from the tile alone (Σ over this tile's keys of P ∘ dP), not the whole row's | expect: rowsum(dO ∘ O)
class MyFlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, block, causal):
        o, lse = attention.tiled_attention(q, k, v, block, block, causal, return_lse=True)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.block, ctx.causal = block, causal
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        block, causal, T = ctx.block, ctx.causal, q.shape[-2]
        scale = 1.0 / math.sqrt(q.shape[-1])
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for j0 in range(0, T, block):
            kj, vj = k[..., j0:j0 + block, :], v[..., j0:j0 + block, :]
            for i0 in range(j0 if causal else 0, T, block):
                qi, doi = q[..., i0:i0 + block, :], do[..., i0:i0 + block, :]
                p = torch.exp(qi @ kj.transpose(-2, -1) * scale - lse[..., i0:i0 + block, :])
                if causal:
                    p = p.masked_fill(torch.arange(j0, j0 + p.shape[-1])[None, :]
                                      > torch.arange(i0, i0 + p.shape[-2])[:, None], 0.0)
                dv[..., j0:j0 + block, :] += p.transpose(-2, -1) @ doi
                dp = doi @ vj.transpose(-2, -1)
                ds = p * (dp - (p * dp).sum(dim=-1, keepdim=True)) * scale  # softmax's backward, of this tile only
                dq[..., i0:i0 + block, :] += ds @ kj
                dk[..., j0:j0 + block, :] += ds.transpose(-2, -1) @ qi
        return dq, dk, dv, None, None

# %% 9.5 | D = rowsum(dO): forgets the O in dO ∘ O | expect: rowsum(dO ∘ O)
class MyFlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, block, causal):
        o, lse = attention.tiled_attention(q, k, v, block, block, causal, return_lse=True)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.block, ctx.causal = block, causal
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        block, causal, T = ctx.block, ctx.causal, q.shape[-2]
        scale = 1.0 / math.sqrt(q.shape[-1])
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        delta = do.sum(dim=-1, keepdim=True)
        for j0 in range(0, T, block):
            kj, vj = k[..., j0:j0 + block, :], v[..., j0:j0 + block, :]
            for i0 in range(j0 if causal else 0, T, block):
                qi, doi = q[..., i0:i0 + block, :], do[..., i0:i0 + block, :]
                p = torch.exp(qi @ kj.transpose(-2, -1) * scale - lse[..., i0:i0 + block, :])
                if causal:
                    p = p.masked_fill(torch.arange(j0, j0 + p.shape[-1])[None, :]
                                      > torch.arange(i0, i0 + p.shape[-2])[:, None], 0.0)
                dv[..., j0:j0 + block, :] += p.transpose(-2, -1) @ doi
                ds = p * (doi @ vj.transpose(-2, -1) - delta[..., i0:i0 + block, :]) * scale
                dq[..., i0:i0 + block, :] += ds @ kj
                dk[..., j0:j0 + block, :] += ds.transpose(-2, -1) @ qi
        return dq, dk, dv, None, None

# %% 9.5 | skips the tiles above the diagonal but forgets the causal mask inside the diagonal tiles | expect: mask the future in backward
class MyFlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, block, causal):
        o, lse = attention.tiled_attention(q, k, v, block, block, causal, return_lse=True)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.block, ctx.causal = block, causal
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        block, causal, T = ctx.block, ctx.causal, q.shape[-2]
        scale = 1.0 / math.sqrt(q.shape[-1])
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        delta = (do * o).sum(dim=-1, keepdim=True)
        for j0 in range(0, T, block):
            kj, vj = k[..., j0:j0 + block, :], v[..., j0:j0 + block, :]
            for i0 in range(j0 if causal else 0, T, block):
                qi, doi = q[..., i0:i0 + block, :], do[..., i0:i0 + block, :]
                p = torch.exp(qi @ kj.transpose(-2, -1) * scale - lse[..., i0:i0 + block, :])  # no mask
                dv[..., j0:j0 + block, :] += p.transpose(-2, -1) @ doi
                ds = p * (doi @ vj.transpose(-2, -1) - delta[..., i0:i0 + block, :]) * scale
                dq[..., i0:i0 + block, :] += ds @ kj
                dk[..., j0:j0 + block, :] += ds.transpose(-2, -1) @ qi
        return dq, dk, dv, None, None

# %% 9.5 | two passes in backward, every P tile of the sequence kept from the first for the second | expect: keeping every tile of P
class MyFlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, block, causal):
        o, lse = attention.tiled_attention(q, k, v, block, block, causal, return_lse=True)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.block, ctx.causal = block, causal
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        b, T, scale = ctx.block, q.shape[-2], 1.0 / math.sqrt(q.shape[-1])
        tiles = {}  # pass 1: every tile of P, recomputed, kept
        for i0 in range(0, T, b):
            for j0 in range(0, i0 + b if ctx.causal else T, b):
                p = torch.exp(q[..., i0:i0 + b, :] @ k[..., j0:j0 + b, :].transpose(-2, -1) * scale - lse[..., i0:i0 + b, :])
                if ctx.causal:
                    p = p.masked_fill(torch.arange(j0, j0 + p.shape[-1])[None, :]
                                      > torch.arange(i0, i0 + p.shape[-2])[:, None], 0.0)
                tiles[i0, j0] = p
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        delta = (do * o).sum(dim=-1, keepdim=True)
        for (i0, j0), p in tiles.items():  # pass 2: the gradients
            doi = do[..., i0:i0 + b, :]
            dv[..., j0:j0 + b, :] += p.transpose(-2, -1) @ doi
            ds = p * (doi @ v[..., j0:j0 + b, :].transpose(-2, -1) - delta[..., i0:i0 + b, :]) * scale
            dq[..., i0:i0 + b, :] += ds @ k[..., j0:j0 + b, :]
            dk[..., j0:j0 + b, :] += ds.transpose(-2, -1) @ q[..., i0:i0 + b, :]
        return dq, dk, dv, None, None

# %% 9.5 | delegates to the course's flash_backward | expect: write the backward yourself
class MyFlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, block, causal):
        o, lse = attention.tiled_attention(q, k, v, block, block, causal, return_lse=True)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.block, ctx.causal = block, causal
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        return (*flash_backward.flash_backward(q, k, v, o, lse, do, ctx.block, ctx.block, ctx.causal), None, None)
