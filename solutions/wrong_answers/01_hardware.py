"""Recorded wrong answers for solutions/01_hardware.ipynb (format: m11_helpers/grading/authoring/wrong_answers.py)."""

# %% 1.1 | reads the datasheet's "80 GB" as 80 × 10⁹ bytes (HBM is binary) | expect: 2**30
BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}  # bytes per element


def state_bytes(weights: str, grads: str, master: str | None, moments: str) -> dict[str, int]:
    def size(name, dtype):
        if dtype not in BYTES:
            raise ValueError(f"{name} must be one of {sorted(BYTES)}, got {dtype!r}")
        return BYTES[dtype]

    out = {"weights": size("weights", weights), "grads": size("grads", grads),
           "master": 0 if master is None else size("master", master),
           "optimizer": 2 * size("moments", moments)}  # Adam keeps two moments: exp_avg, exp_avg_sq
    return {**out, "total": sum(out.values())}


def largest_model(datasheet_gb: float, states: dict, world: int = 1, reserve: float = 0.0) -> int:
    memory = int(datasheet_gb * 1e9 * (1 - reserve))  # GB as on the datasheet
    # each GPU holds ceil(P / N) elements of every state: total * ceil(P / N) <= memory <=> P <= N * (memory // total)
    return world * (memory // states["total"])


def min_gpus(params: int, datasheet_gb: float, states: dict, reserve: float = 0.0) -> int:
    per_gpu = largest_model(datasheet_gb, states, 1, reserve)  # the most elements of each state one GPU holds
    return math.ceil(params / per_gpu)  # ceil(P / N) <= per_gpu <=> N >= P / per_gpu

# %% 1.1 | counts one Adam moment, not two | expect: two moments
BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}  # bytes per element


def state_bytes(weights: str, grads: str, master: str | None, moments: str) -> dict[str, int]:
    def size(name, dtype):
        if dtype not in BYTES:
            raise ValueError(f"{name} must be one of {sorted(BYTES)}, got {dtype!r}")
        return BYTES[dtype]

    out = {"weights": size("weights", weights), "grads": size("grads", grads),
           "master": 0 if master is None else size("master", master),
           "optimizer": size("moments", moments)}  # the optimizer state
    return {**out, "total": sum(out.values())}


def largest_model(datasheet_gb: float, states: dict, world: int = 1, reserve: float = 0.0) -> int:
    memory = int(datasheet_gb * 2**30 * (1 - reserve))  # HBM "GB" are GiB; the reserve stays free
    # each GPU holds ceil(P / N) elements of every state: total * ceil(P / N) <= memory <=> P <= N * (memory // total)
    return world * (memory // states["total"])


def min_gpus(params: int, datasheet_gb: float, states: dict, reserve: float = 0.0) -> int:
    per_gpu = largest_model(datasheet_gb, states, 1, reserve)  # the most elements of each state one GPU holds
    return math.ceil(params / per_gpu)  # ceil(P / N) <= per_gpu <=> N >= P / per_gpu

# %% 1.1 | counts an fp32 master copy even when there is none | expect: no master copy
BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}  # bytes per element


def state_bytes(weights: str, grads: str, master: str | None, moments: str) -> dict[str, int]:
    def size(name, dtype):
        if dtype not in BYTES:
            raise ValueError(f"{name} must be one of {sorted(BYTES)}, got {dtype!r}")
        return BYTES[dtype]

    out = {"weights": size("weights", weights), "grads": size("grads", grads),
           "master": 4 if master is None else size("master", master),
           "optimizer": 2 * size("moments", moments)}  # Adam keeps two moments: exp_avg, exp_avg_sq
    return {**out, "total": sum(out.values())}


def largest_model(datasheet_gb: float, states: dict, world: int = 1, reserve: float = 0.0) -> int:
    memory = int(datasheet_gb * 2**30 * (1 - reserve))  # HBM "GB" are GiB; the reserve stays free
    # each GPU holds ceil(P / N) elements of every state: total * ceil(P / N) <= memory <=> P <= N * (memory // total)
    return world * (memory // states["total"])


def min_gpus(params: int, datasheet_gb: float, states: dict, reserve: float = 0.0) -> int:
    per_gpu = largest_model(datasheet_gb, states, 1, reserve)  # the most elements of each state one GPU holds
    return math.ceil(params / per_gpu)  # ceil(P / N) <= per_gpu <=> N >= P / per_gpu

# %% 1.1 | inverts ⌊N·M/b⌋: forgets that each GPU holds ⌈Ψ/N⌉ (padded shards) | expect: ⌈Ψ/N⌉
BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}  # bytes per element


def state_bytes(weights: str, grads: str, master: str | None, moments: str) -> dict[str, int]:
    def size(name, dtype):
        if dtype not in BYTES:
            raise ValueError(f"{name} must be one of {sorted(BYTES)}, got {dtype!r}")
        return BYTES[dtype]

    out = {"weights": size("weights", weights), "grads": size("grads", grads),
           "master": 0 if master is None else size("master", master),
           "optimizer": 2 * size("moments", moments)}  # Adam keeps two moments: exp_avg, exp_avg_sq
    return {**out, "total": sum(out.values())}


def largest_model(datasheet_gb: float, states: dict, world: int = 1, reserve: float = 0.0) -> int:
    memory = int(datasheet_gb * 2**30 * (1 - reserve))  # HBM "GB" are GiB; the reserve stays free
    # each GPU holds ceil(P / N) elements of every state: total * ceil(P / N) <= memory <=> P <= N * (memory // total)
    return world * memory // states["total"]  # N GPUs hold N·M bytes


def min_gpus(params: int, datasheet_gb: float, states: dict, reserve: float = 0.0) -> int:
    per_gpu = largest_model(datasheet_gb, states, 1, reserve)  # the most elements of each state one GPU holds
    return math.ceil(params / per_gpu)  # ceil(P / N) <= per_gpu <=> N >= P / per_gpu

# %% 1.1 | the fewest GPUs from the bytes alone, ⌈Ψ·b/M⌉ (the padding needs one more) | expect: padded
BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}  # bytes per element


def state_bytes(weights: str, grads: str, master: str | None, moments: str) -> dict[str, int]:
    def size(name, dtype):
        if dtype not in BYTES:
            raise ValueError(f"{name} must be one of {sorted(BYTES)}, got {dtype!r}")
        return BYTES[dtype]

    out = {"weights": size("weights", weights), "grads": size("grads", grads),
           "master": 0 if master is None else size("master", master),
           "optimizer": 2 * size("moments", moments)}  # Adam keeps two moments: exp_avg, exp_avg_sq
    return {**out, "total": sum(out.values())}


def largest_model(datasheet_gb: float, states: dict, world: int = 1, reserve: float = 0.0) -> int:
    memory = int(datasheet_gb * 2**30 * (1 - reserve))  # HBM "GB" are GiB; the reserve stays free
    # each GPU holds ceil(P / N) elements of every state: total * ceil(P / N) <= memory <=> P <= N * (memory // total)
    return world * (memory // states["total"])


def min_gpus(params: int, datasheet_gb: float, states: dict, reserve: float = 0.0) -> int:
    memory = datasheet_gb * 2**30 * (1 - reserve)
    return math.ceil(params * states["total"] / memory)  # all the bytes over one GPU's bytes

# %% 1.1 | keeps the reserve for the states instead of free | expect: kept FREE
BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}  # bytes per element


def state_bytes(weights: str, grads: str, master: str | None, moments: str) -> dict[str, int]:
    def size(name, dtype):
        if dtype not in BYTES:
            raise ValueError(f"{name} must be one of {sorted(BYTES)}, got {dtype!r}")
        return BYTES[dtype]

    out = {"weights": size("weights", weights), "grads": size("grads", grads),
           "master": 0 if master is None else size("master", master),
           "optimizer": 2 * size("moments", moments)}  # Adam keeps two moments: exp_avg, exp_avg_sq
    return {**out, "total": sum(out.values())}


def largest_model(datasheet_gb: float, states: dict, world: int = 1, reserve: float = 0.0) -> int:
    memory = int(datasheet_gb * 2**30 * (reserve or 1.0))  # the reserved part
    # each GPU holds ceil(P / N) elements of every state: total * ceil(P / N) <= memory <=> P <= N * (memory // total)
    return world * (memory // states["total"])


def min_gpus(params: int, datasheet_gb: float, states: dict, reserve: float = 0.0) -> int:
    per_gpu = largest_model(datasheet_gb, states, 1, reserve)  # the most elements of each state one GPU holds
    return math.ceil(params / per_gpu)  # ceil(P / N) <= per_gpu <=> N >= P / per_gpu

# %% 1.1 | rounds the number of GPUs to the nearest instead of up | expect: round UP
BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}  # bytes per element


def state_bytes(weights: str, grads: str, master: str | None, moments: str) -> dict[str, int]:
    def size(name, dtype):
        if dtype not in BYTES:
            raise ValueError(f"{name} must be one of {sorted(BYTES)}, got {dtype!r}")
        return BYTES[dtype]

    out = {"weights": size("weights", weights), "grads": size("grads", grads),
           "master": 0 if master is None else size("master", master),
           "optimizer": 2 * size("moments", moments)}  # Adam keeps two moments: exp_avg, exp_avg_sq
    return {**out, "total": sum(out.values())}


def largest_model(datasheet_gb: float, states: dict, world: int = 1, reserve: float = 0.0) -> int:
    memory = int(datasheet_gb * 2**30 * (1 - reserve))  # HBM "GB" are GiB; the reserve stays free
    # each GPU holds ceil(P / N) elements of every state: total * ceil(P / N) <= memory <=> P <= N * (memory // total)
    return world * (memory // states["total"])


def min_gpus(params: int, datasheet_gb: float, states: dict, reserve: float = 0.0) -> int:
    per_gpu = largest_model(datasheet_gb, states, 1, reserve)  # the most elements of each state one GPU holds
    return max(1, round(params / per_gpu))

# %% 1.1 | accepts any dtype name (fp64 reads as 0 bytes) | expect: raise ValueError
BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}  # bytes per element


def state_bytes(weights: str, grads: str, master: str | None, moments: str) -> dict[str, int]:
    def size(name, dtype):
        return BYTES.get(dtype, 0)

    out = {"weights": size("weights", weights), "grads": size("grads", grads),
           "master": 0 if master is None else size("master", master),
           "optimizer": 2 * size("moments", moments)}  # Adam keeps two moments: exp_avg, exp_avg_sq
    return {**out, "total": sum(out.values())}


def largest_model(datasheet_gb: float, states: dict, world: int = 1, reserve: float = 0.0) -> int:
    memory = int(datasheet_gb * 2**30 * (1 - reserve))  # HBM "GB" are GiB; the reserve stays free
    # each GPU holds ceil(P / N) elements of every state: total * ceil(P / N) <= memory <=> P <= N * (memory // total)
    return world * (memory // states["total"])


def min_gpus(params: int, datasheet_gb: float, states: dict, reserve: float = 0.0) -> int:
    per_gpu = largest_model(datasheet_gb, states, 1, reserve)  # the most elements of each state one GPU holds
    return math.ceil(params / per_gpu)  # ceil(P / N) <= per_gpu <=> N >= P / per_gpu

# %% 1.1 | delegates to the course's compute_budget helper | expect: work it out yourself
BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}  # bytes per element


def state_bytes(weights: str, grads: str, master: str | None, moments: str) -> dict[str, int]:
    def size(name, dtype):
        if dtype not in BYTES:
            raise ValueError(f"{name} must be one of {sorted(BYTES)}, got {dtype!r}")
        return BYTES[dtype]

    out = {"weights": size("weights", weights), "grads": size("grads", grads),
           "master": 0 if master is None else size("master", master),
           "optimizer": 2 * size("moments", moments)}  # Adam keeps two moments: exp_avg, exp_avg_sq
    return {**out, "total": sum(out.values())}


def largest_model(datasheet_gb: float, states: dict, world: int = 1, reserve: float = 0.0) -> int:
    memory = int(datasheet_gb * 2**30 * (1 - reserve))  # HBM "GB" are GiB; the reserve stays free
    # each GPU holds ceil(P / N) elements of every state: total * ceil(P / N) <= memory <=> P <= N * (memory // total)
    return world * compute_budget.max_params(memory, states["total"])


def min_gpus(params: int, datasheet_gb: float, states: dict, reserve: float = 0.0) -> int:
    per_gpu = largest_model(datasheet_gb, states, 1, reserve)  # the most elements of each state one GPU holds
    return math.ceil(params / per_gpu)  # ceil(P / N) <= per_gpu <=> N >= P / per_gpu

# %% 1.2 | counts reading A and B but not writing C | expect: output C
def compute_bound_tokens(k: int, n: int, bytes_per_element: int, peak_flops: float, bandwidth: float) -> int | None:
    ridge = peak_flops / bandwidth
    slope = 2 * k * n - ridge * bytes_per_element * k
    if slope <= 0:
        return None
    return max(1, math.ceil(ridge * bytes_per_element * k * n / slope))

# %% 1.2 | counts m·n·k FLOPs (forgets the add) | expect: one multiply and one add
def compute_bound_tokens(k: int, n: int, bytes_per_element: int, peak_flops: float, bandwidth: float) -> int | None:
    ridge = peak_flops / bandwidth
    slope = k * n - ridge * bytes_per_element * (k + n)
    if slope <= 0:
        return None
    return max(1, math.ceil(ridge * bytes_per_element * k * n / slope))

# %% 1.2 | off by one: the largest m that is still memory-bound | expect: smallest m
def compute_bound_tokens(k: int, n: int, bytes_per_element: int, peak_flops: float, bandwidth: float) -> int | None:
    ridge = peak_flops / bandwidth
    slope = 2 * k * n - ridge * bytes_per_element * (k + n)
    if slope <= 0:
        return None
    return int(ridge * bytes_per_element * k * n / slope)

# %% 1.2 | no "never" case: a negative m when the intensity can never reach the ridge | expect: return None
def compute_bound_tokens(k: int, n: int, bytes_per_element: int, peak_flops: float, bandwidth: float) -> int | None:
    ridge = peak_flops / bandwidth
    slope = 2 * k * n - ridge * bytes_per_element * (k + n)
    return math.ceil(ridge * bytes_per_element * k * n / slope)

# %% 1.2 | delegates to the course's roofline helper | expect: derive the threshold yourself
def compute_bound_tokens(k: int, n: int, bytes_per_element: int, peak_flops: float, bandwidth: float) -> int | None:
    dtype = {4: "fp32", 2: "bf16", 1: "fp8"}[bytes_per_element]
    for m in range(1, 1 << 20):
        if roofline.matmul_intensity(m, n, k, dtype) >= peak_flops / bandwidth:
            return m
    return None

# %% 1.2 | searches m with the course's matmul_flops / matmul_bytes instead of deriving | expect: derive the threshold yourself
def compute_bound_tokens(k: int, n: int, bytes_per_element: int, peak_flops: float, bandwidth: float) -> int | None:
    dtype = {4: "fp32", 2: "bf16", 1: "fp8"}[bytes_per_element]
    ridge = peak_flops / bandwidth
    if k * n / (bytes_per_element * (k + n)) <= ridge:
        return None
    m = 1
    while roofline.arithmetic_intensity(roofline.matmul_flops(m, n, k), roofline.matmul_bytes(m, n, k, dtype)) < ridge:
        m += 1
    return m

# %% 1.3 | counts m·k·n FLOPs (forgets the add) | expect: one multiply and one add
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def time_matmul(m: int, k: int, n: int, repeats: int) -> float:
    a, b = torch.randn(m, k, device=DEVICE), torch.randn(k, n, device=DEVICE)  # (m, k), (k, n) fp32
    sync = torch.cuda.synchronize if DEVICE.type == "cuda" else (lambda: None)
    a @ b  # warm-up: the first call pays for kernel selection and caches
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        a @ b
        sync()  # a GPU runs asynchronously: wait for the matmul before reading the clock
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def roofline_point(m: int, k: int, n: int, seconds: float) -> tuple[float, float]:
    flops, nbytes = m * k * n, 4 * (m * k + k * n + m * n)  # one multiply-add per term; fp32 = 4 bytes
    return flops / nbytes, flops / seconds


def design_sweep() -> list[tuple[int, int, int]]:
    # m tokens through a 1024–2048-wide layer: intensity grows with m, from ~0.5 (m = 1) to 128 (768³)
    return [(1, 2048, 2048), (8, 2048, 2048), (32, 1024, 1024), (128, 1024, 1024), (256, 1024, 1024), (768, 768, 768)]


def roofs(points: list[tuple[float, float]]) -> tuple[float, float]:
    peak = max(achieved for _, achieved in points)  # the flat roof: no point above it
    bandwidth = max(achieved / intensity for intensity, achieved in points)  # the slanted one: the steepest point
    return peak, bandwidth
    ### END SOLUTION

# %% 1.3 | counts reading A and B but not writing C | expect: count the output's bytes
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def time_matmul(m: int, k: int, n: int, repeats: int) -> float:
    a, b = torch.randn(m, k, device=DEVICE), torch.randn(k, n, device=DEVICE)  # (m, k), (k, n) fp32
    sync = torch.cuda.synchronize if DEVICE.type == "cuda" else (lambda: None)
    a @ b  # warm-up: the first call pays for kernel selection and caches
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        a @ b
        sync()  # a GPU runs asynchronously: wait for the matmul before reading the clock
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def roofline_point(m: int, k: int, n: int, seconds: float) -> tuple[float, float]:
    flops, nbytes = 2 * m * k * n, 4 * (m * k + k * n)  # one multiply-add per term; fp32 = 4 bytes
    return flops / nbytes, flops / seconds


def design_sweep() -> list[tuple[int, int, int]]:
    # m tokens through a 1024–2048-wide layer: intensity grows with m, from ~0.5 (m = 1) to 128 (768³)
    return [(1, 2048, 2048), (8, 2048, 2048), (32, 1024, 1024), (128, 1024, 1024), (256, 1024, 1024), (768, 768, 768)]


def roofs(points: list[tuple[float, float]]) -> tuple[float, float]:
    peak = max(achieved for _, achieved in points)  # the flat roof: no point above it
    bandwidth = max(achieved / intensity for intensity, achieved in points)  # the slanted one: the steepest point
    return peak, bandwidth
    ### END SOLUTION

# %% 1.3 | returns the total over the repeats, not one matmul's time | expect: not the sum over the repeats
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def time_matmul(m: int, k: int, n: int, repeats: int) -> float:
    a, b = torch.randn(m, k, device=DEVICE), torch.randn(k, n, device=DEVICE)  # (m, k), (k, n) fp32
    sync = torch.cuda.synchronize if DEVICE.type == "cuda" else (lambda: None)
    a @ b  # warm-up: the first call pays for kernel selection and caches
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        a @ b
        sync()  # a GPU runs asynchronously: wait for the matmul before reading the clock
        times.append(time.perf_counter() - t0)
    return sum(times)


def roofline_point(m: int, k: int, n: int, seconds: float) -> tuple[float, float]:
    flops, nbytes = 2 * m * k * n, 4 * (m * k + k * n + m * n)  # one multiply-add per term; fp32 = 4 bytes
    return flops / nbytes, flops / seconds


def design_sweep() -> list[tuple[int, int, int]]:
    # m tokens through a 1024–2048-wide layer: intensity grows with m, from ~0.5 (m = 1) to 128 (768³)
    return [(1, 2048, 2048), (8, 2048, 2048), (32, 1024, 1024), (128, 1024, 1024), (256, 1024, 1024), (768, 768, 768)]


def roofs(points: list[tuple[float, float]]) -> tuple[float, float]:
    peak = max(achieved for _, achieved in points)  # the flat roof: no point above it
    bandwidth = max(achieved / intensity for intensity, achieved in points)  # the slanted one: the steepest point
    return peak, bandwidth
    ### END SOLUTION

# %% 1.3 | no warm-up: the first matmul is timed too | expect: warm-up
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def time_matmul(m: int, k: int, n: int, repeats: int) -> float:
    a, b = torch.randn(m, k, device=DEVICE), torch.randn(k, n, device=DEVICE)  # (m, k), (k, n) fp32
    sync = torch.cuda.synchronize if DEVICE.type == "cuda" else (lambda: None)
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        a @ b
        sync()  # a GPU runs asynchronously: wait for the matmul before reading the clock
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def roofline_point(m: int, k: int, n: int, seconds: float) -> tuple[float, float]:
    flops, nbytes = 2 * m * k * n, 4 * (m * k + k * n + m * n)  # one multiply-add per term; fp32 = 4 bytes
    return flops / nbytes, flops / seconds


def design_sweep() -> list[tuple[int, int, int]]:
    # m tokens through a 1024–2048-wide layer: intensity grows with m, from ~0.5 (m = 1) to 128 (768³)
    return [(1, 2048, 2048), (8, 2048, 2048), (32, 1024, 1024), (128, 1024, 1024), (256, 1024, 1024), (768, 768, 768)]


def roofs(points: list[tuple[float, float]]) -> tuple[float, float]:
    peak = max(achieved for _, achieved in points)  # the flat roof: no point above it
    bandwidth = max(achieved / intensity for intensity, achieved in points)  # the slanted one: the steepest point
    return peak, bandwidth
    ### END SOLUTION

# %% 1.3 | a sweep of large square matmuls only (never memory-bound) | expect: memory-bound everywhere
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def time_matmul(m: int, k: int, n: int, repeats: int) -> float:
    a, b = torch.randn(m, k, device=DEVICE), torch.randn(k, n, device=DEVICE)  # (m, k), (k, n) fp32
    sync = torch.cuda.synchronize if DEVICE.type == "cuda" else (lambda: None)
    a @ b  # warm-up: the first call pays for kernel selection and caches
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        a @ b
        sync()  # a GPU runs asynchronously: wait for the matmul before reading the clock
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def roofline_point(m: int, k: int, n: int, seconds: float) -> tuple[float, float]:
    flops, nbytes = 2 * m * k * n, 4 * (m * k + k * n + m * n)  # one multiply-add per term; fp32 = 4 bytes
    return flops / nbytes, flops / seconds


def design_sweep() -> list[tuple[int, int, int]]:
    # m tokens through a 1024–2048-wide layer: intensity grows with m, from ~0.5 (m = 1) to 128 (768³)
    return [(256, 256, 256), (384, 384, 384), (512, 512, 512), (640, 640, 640), (768, 768, 768), (896, 896, 896)]


def roofs(points: list[tuple[float, float]]) -> tuple[float, float]:
    peak = max(achieved for _, achieved in points)  # the flat roof: no point above it
    bandwidth = max(achieved / intensity for intensity, achieved in points)  # the slanted one: the steepest point
    return peak, bandwidth
    ### END SOLUTION

# %% 1.3 | a sweep that ends at 512³ (never past 100 FLOP/byte) | expect: ≥ 100 FLOP/byte
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def time_matmul(m: int, k: int, n: int, repeats: int) -> float:
    a, b = torch.randn(m, k, device=DEVICE), torch.randn(k, n, device=DEVICE)  # (m, k), (k, n) fp32
    sync = torch.cuda.synchronize if DEVICE.type == "cuda" else (lambda: None)
    a @ b  # warm-up: the first call pays for kernel selection and caches
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        a @ b
        sync()  # a GPU runs asynchronously: wait for the matmul before reading the clock
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def roofline_point(m: int, k: int, n: int, seconds: float) -> tuple[float, float]:
    flops, nbytes = 2 * m * k * n, 4 * (m * k + k * n + m * n)  # one multiply-add per term; fp32 = 4 bytes
    return flops / nbytes, flops / seconds


def design_sweep() -> list[tuple[int, int, int]]:
    # m tokens through a 1024–2048-wide layer: intensity grows with m, from ~0.5 (m = 1) to 128 (768³)
    return [(1, 2048, 2048), (8, 2048, 2048), (32, 1024, 1024), (128, 1024, 1024), (256, 1024, 1024), (512, 512, 512)]


def roofs(points: list[tuple[float, float]]) -> tuple[float, float]:
    peak = max(achieved for _, achieved in points)  # the flat roof: no point above it
    bandwidth = max(achieved / intensity for intensity, achieved in points)  # the slanted one: the steepest point
    return peak, bandwidth
    ### END SOLUTION

# %% 1.3 | the roofs as the mean of the points (points above the roofline) | expect: bound every point
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def time_matmul(m: int, k: int, n: int, repeats: int) -> float:
    a, b = torch.randn(m, k, device=DEVICE), torch.randn(k, n, device=DEVICE)  # (m, k), (k, n) fp32
    sync = torch.cuda.synchronize if DEVICE.type == "cuda" else (lambda: None)
    a @ b  # warm-up: the first call pays for kernel selection and caches
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        a @ b
        sync()  # a GPU runs asynchronously: wait for the matmul before reading the clock
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def roofline_point(m: int, k: int, n: int, seconds: float) -> tuple[float, float]:
    flops, nbytes = 2 * m * k * n, 4 * (m * k + k * n + m * n)  # one multiply-add per term; fp32 = 4 bytes
    return flops / nbytes, flops / seconds


def design_sweep() -> list[tuple[int, int, int]]:
    # m tokens through a 1024–2048-wide layer: intensity grows with m, from ~0.5 (m = 1) to 128 (768³)
    return [(1, 2048, 2048), (8, 2048, 2048), (32, 1024, 1024), (128, 1024, 1024), (256, 1024, 1024), (768, 768, 768)]


def roofs(points: list[tuple[float, float]]) -> tuple[float, float]:
    peak = statistics.mean(achieved for _, achieved in points)  # the flat roof: no point above it
    bandwidth = max(achieved / intensity for intensity, achieved in points)  # the slanted one: the steepest point
    return peak, bandwidth
    ### END SOLUTION

# %% 1.3 | the bandwidth from the most memory-bound point only (not the steepest) | expect: achieved / intensity
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def time_matmul(m: int, k: int, n: int, repeats: int) -> float:
    a, b = torch.randn(m, k, device=DEVICE), torch.randn(k, n, device=DEVICE)  # (m, k), (k, n) fp32
    sync = torch.cuda.synchronize if DEVICE.type == "cuda" else (lambda: None)
    a @ b  # warm-up: the first call pays for kernel selection and caches
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        a @ b
        sync()  # a GPU runs asynchronously: wait for the matmul before reading the clock
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def roofline_point(m: int, k: int, n: int, seconds: float) -> tuple[float, float]:
    flops, nbytes = 2 * m * k * n, 4 * (m * k + k * n + m * n)  # one multiply-add per term; fp32 = 4 bytes
    return flops / nbytes, flops / seconds


def design_sweep() -> list[tuple[int, int, int]]:
    # m tokens through a 1024–2048-wide layer: intensity grows with m, from ~0.5 (m = 1) to 128 (768³)
    return [(1, 2048, 2048), (8, 2048, 2048), (32, 1024, 1024), (128, 1024, 1024), (256, 1024, 1024), (768, 768, 768)]


def roofs(points: list[tuple[float, float]]) -> tuple[float, float]:
    peak = max(achieved for _, achieved in points)  # the flat roof: no point above it
    bandwidth = min(points)[1] / min(points)[0]  # the slanted one: the steepest point
    return peak, bandwidth
    ### END SOLUTION

# %% 1.3 | calls the course's roofline helpers | expect: yourself
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def time_matmul(m: int, k: int, n: int, repeats: int) -> float:
    a, b = torch.randn(m, k, device=DEVICE), torch.randn(k, n, device=DEVICE)  # (m, k), (k, n) fp32
    sync = torch.cuda.synchronize if DEVICE.type == "cuda" else (lambda: None)
    a @ b  # warm-up: the first call pays for kernel selection and caches
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        a @ b
        sync()  # a GPU runs asynchronously: wait for the matmul before reading the clock
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def roofline_point(m: int, k: int, n: int, seconds: float) -> tuple[float, float]:
    flops, nbytes = roofline.matmul_flops(m, n, k), roofline.matmul_bytes(m, n, k, "fp32")  # one multiply-add per term; fp32 = 4 bytes
    return flops / nbytes, flops / seconds


def design_sweep() -> list[tuple[int, int, int]]:
    # m tokens through a 1024–2048-wide layer: intensity grows with m, from ~0.5 (m = 1) to 128 (768³)
    return [(1, 2048, 2048), (8, 2048, 2048), (32, 1024, 1024), (128, 1024, 1024), (256, 1024, 1024), (768, 768, 768)]


def roofs(points: list[tuple[float, float]]) -> tuple[float, float]:
    peak = max(achieved for _, achieved in points)  # the flat roof: no point above it
    bandwidth = max(achieved / intensity for intensity, achieved in points)  # the slanted one: the steepest point
    return peak, bandwidth
    ### END SOLUTION

# %% 1.4 | both ranks send first, then receive | expect: deadlock
def ping_pong(message: torch.Tensor, repeats: int) -> float | None:
    rank, other = dist.get_rank(), 1 - dist.get_rank()
    trips = []
    for i in range(1 + repeats):
        t0 = time.perf_counter()
        dist.send(message, dst=other)
        dist.recv(message, src=other)
        if i:
            trips.append(time.perf_counter() - t0)
    return statistics.median(trips) / 2 if rank == 0 else None

# %% 1.4 | returns the round trip, not half of it | expect: round trip
def ping_pong(message: torch.Tensor, repeats: int) -> float | None:
    rank = dist.get_rank()
    trips = []
    for i in range(1 + repeats):
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(message, dst=1)
            dist.recv(message, src=1)
        else:
            dist.recv(message, src=0)
            dist.send(message, dst=0)
        if i:
            trips.append(time.perf_counter() - t0)
    return statistics.median(trips) if rank == 0 else None

# %% 1.4 | no echo: rank 0 times its send, rank 1 only receives | expect: echo
def ping_pong(message: torch.Tensor, repeats: int) -> float | None:
    rank = dist.get_rank()
    times = []
    for i in range(1 + repeats):
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(message, dst=1)
        else:
            dist.recv(message, src=0)
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) if rank == 0 else None

# %% 1.4 | times the first exchange too (no warm-up) | expect: warm-up
def ping_pong(message: torch.Tensor, repeats: int) -> float | None:
    rank = dist.get_rank()
    trips = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(message, dst=1)
            dist.recv(message, src=1)
        else:
            dist.recv(message, src=0)
            dist.send(message, dst=0)
        trips.append(time.perf_counter() - t0)
    return statistics.median(trips) / 2 if rank == 0 else None

# %% 1.4 | a round trip of two broadcasts instead of a send and its echo | expect: point-to-point
def ping_pong(message: torch.Tensor, repeats: int) -> float | None:
    trips = []
    for i in range(1 + repeats):
        t0 = time.perf_counter()
        dist.broadcast(message, src=0)
        dist.broadcast(message, src=1)
        if i:
            trips.append(time.perf_counter() - t0)
    return statistics.median(trips) / 2 if dist.get_rank() == 0 else None
