"""Recorded wrong answers for solutions/06_mixed_precision.ipynb (format: m11_helpers/grading/authoring/wrong_answers.py)."""

# %% 6.1 | steps even when a gradient overflowed (never skips) | expect: do not call optimizer.step()
class LossScaler:
    """torch.amp.GradScaler's dynamic loss scaling, built: scale, unscale + overflow check, skip, update."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        self._scale, self._clean = float(init_scale), 0  # the scale, and the clean steps in a row
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self._found_inf, self._unscaled = False, False  # this step's state: reset by update()

    def get_scale(self) -> float:
        return self._scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale  # backward then yields gradients × scale, out of fp16's underflow

    def unscale_(self, optimizer) -> bool:
        if self._unscaled:  # the loop unscaled already (to clip): dividing again would shrink the step
            return self._found_inf
        found = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    found |= not bool(torch.isfinite(p.grad).all())  # inf and NaN both
                    p.grad.div_(self._scale)  # a power of two: exact
        self._found_inf, self._unscaled = found, True
        return found

    def step(self, optimizer) -> bool:
        self.unscale_(optimizer)
        optimizer.step()
        return True

    def update(self) -> None:
        if self._found_inf:
            self._scale, self._clean = self._scale * self.backoff_factor, 0
        else:
            self._clean += 1
            if self._clean == self.growth_interval:
                self._scale, self._clean = self._scale * self.growth_factor, 0
        self._found_inf, self._unscaled = False, False


def train_fp16(model, batches, scaler, lr: float = 0.05, max_norm: float = 1.0):
    """FP16 autocast + your scaler + global-norm clipping + SGD, one step per (x, y). Returns (losses, scales)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, scales = [], []
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)  # clip the true gradient, not the one multiplied by the scale
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(opt)  # skipped when a gradient is inf/NaN
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return losses, scales

# %% 6.1 | keeps the clean-step count after an overflow | expect: back to 0
class LossScaler:
    """torch.amp.GradScaler's dynamic loss scaling, built: scale, unscale + overflow check, skip, update."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        self._scale, self._clean = float(init_scale), 0  # the scale, and the clean steps in a row
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self._found_inf, self._unscaled = False, False  # this step's state: reset by update()

    def get_scale(self) -> float:
        return self._scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale  # backward then yields gradients × scale, out of fp16's underflow

    def unscale_(self, optimizer) -> bool:
        if self._unscaled:  # the loop unscaled already (to clip): dividing again would shrink the step
            return self._found_inf
        found = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    found |= not bool(torch.isfinite(p.grad).all())  # inf and NaN both
                    p.grad.div_(self._scale)  # a power of two: exact
        self._found_inf, self._unscaled = found, True
        return found

    def step(self, optimizer) -> bool:
        if self.unscale_(optimizer):
            return False  # an overflowed gradient: the weights stay as they are
        optimizer.step()
        return True

    def update(self) -> None:
        if self._found_inf:
            self._scale = self._scale * self.backoff_factor
        else:
            self._clean += 1
            if self._clean == self.growth_interval:
                self._scale, self._clean = self._scale * self.growth_factor, 0
        self._found_inf, self._unscaled = False, False


def train_fp16(model, batches, scaler, lr: float = 0.05, max_norm: float = 1.0):
    """FP16 autocast + your scaler + global-norm clipping + SGD, one step per (x, y). Returns (losses, scales)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, scales = [], []
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)  # clip the true gradient, not the one multiplied by the scale
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(opt)  # skipped when a gradient is inf/NaN
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return losses, scales

# %% 6.1 | grows one clean step too late (compares before counting this step) | expect: growth_interval-th clean step
class LossScaler:
    """torch.amp.GradScaler's dynamic loss scaling, built: scale, unscale + overflow check, skip, update."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        self._scale, self._clean = float(init_scale), 0  # the scale, and the clean steps in a row
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self._found_inf, self._unscaled = False, False  # this step's state: reset by update()

    def get_scale(self) -> float:
        return self._scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale  # backward then yields gradients × scale, out of fp16's underflow

    def unscale_(self, optimizer) -> bool:
        if self._unscaled:  # the loop unscaled already (to clip): dividing again would shrink the step
            return self._found_inf
        found = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    found |= not bool(torch.isfinite(p.grad).all())  # inf and NaN both
                    p.grad.div_(self._scale)  # a power of two: exact
        self._found_inf, self._unscaled = found, True
        return found

    def step(self, optimizer) -> bool:
        if self.unscale_(optimizer):
            return False  # an overflowed gradient: the weights stay as they are
        optimizer.step()
        return True

    def update(self) -> None:
        if self._found_inf:
            self._scale, self._clean = self._scale * self.backoff_factor, 0
        else:
            if self._clean == self.growth_interval:
                self._scale, self._clean = self._scale * self.growth_factor, 0
            else:
                self._clean += 1
        self._found_inf, self._unscaled = False, False


def train_fp16(model, batches, scaler, lr: float = 0.05, max_norm: float = 1.0):
    """FP16 autocast + your scaler + global-norm clipping + SGD, one step per (x, y). Returns (losses, scales)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, scales = [], []
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)  # clip the true gradient, not the one multiplied by the scale
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(opt)  # skipped when a gradient is inf/NaN
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return losses, scales

# %% 6.1 | unscales again in step() after the loop's unscale_ (gradients divided twice) | expect: ONCE per step
class LossScaler:
    """torch.amp.GradScaler's dynamic loss scaling, built: scale, unscale + overflow check, skip, update."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        self._scale, self._clean = float(init_scale), 0  # the scale, and the clean steps in a row
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self._found_inf, self._unscaled = False, False  # this step's state: reset by update()

    def get_scale(self) -> float:
        return self._scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale  # backward then yields gradients × scale, out of fp16's underflow

    def unscale_(self, optimizer) -> bool:
        found = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    found |= not bool(torch.isfinite(p.grad).all())  # inf and NaN both
                    p.grad.div_(self._scale)  # a power of two: exact
        self._found_inf, self._unscaled = found, True
        return found

    def step(self, optimizer) -> bool:
        if self.unscale_(optimizer):
            return False  # an overflowed gradient: the weights stay as they are
        optimizer.step()
        return True

    def update(self) -> None:
        if self._found_inf:
            self._scale, self._clean = self._scale * self.backoff_factor, 0
        else:
            self._clean += 1
            if self._clean == self.growth_interval:
                self._scale, self._clean = self._scale * self.growth_factor, 0
        self._found_inf, self._unscaled = False, False


def train_fp16(model, batches, scaler, lr: float = 0.05, max_norm: float = 1.0):
    """FP16 autocast + your scaler + global-norm clipping + SGD, one step per (x, y). Returns (losses, scales)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, scales = [], []
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)  # clip the true gradient, not the one multiplied by the scale
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(opt)  # skipped when a gradient is inf/NaN
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return losses, scales

# %% 6.1 | a sticky overflow flag: one overflow skips every later step | expect: forgets this step's overflow
class LossScaler:
    """torch.amp.GradScaler's dynamic loss scaling, built: scale, unscale + overflow check, skip, update."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        self._scale, self._clean = float(init_scale), 0  # the scale, and the clean steps in a row
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self._found_inf, self._unscaled = False, False  # this step's state: reset by update()

    def get_scale(self) -> float:
        return self._scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale  # backward then yields gradients × scale, out of fp16's underflow

    def unscale_(self, optimizer) -> bool:
        if self._unscaled:  # the loop unscaled already (to clip): dividing again would shrink the step
            return self._found_inf
        found = self._found_inf  # sticky: never cleared
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    found |= not bool(torch.isfinite(p.grad).all())  # inf and NaN both
                    p.grad.div_(self._scale)  # a power of two: exact
        self._found_inf, self._unscaled = found, True
        return found

    def step(self, optimizer) -> bool:
        if self.unscale_(optimizer):
            return False  # an overflowed gradient: the weights stay as they are
        optimizer.step()
        return True

    def update(self) -> None:
        if self._found_inf:
            self._scale, self._clean = self._scale * self.backoff_factor, 0
        else:
            self._clean += 1
            if self._clean == self.growth_interval:
                self._scale, self._clean = self._scale * self.growth_factor, 0
        self._unscaled = False


def train_fp16(model, batches, scaler, lr: float = 0.05, max_norm: float = 1.0):
    """FP16 autocast + your scaler + global-norm clipping + SGD, one step per (x, y). Returns (losses, scales)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, scales = [], []
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)  # clip the true gradient, not the one multiplied by the scale
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(opt)  # skipped when a gradient is inf/NaN
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return losses, scales

# %% 6.1 | checks for inf only (torch.isinf): a NaN gradient is stepped | expect: misses NaN
class LossScaler:
    """torch.amp.GradScaler's dynamic loss scaling, built: scale, unscale + overflow check, skip, update."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        self._scale, self._clean = float(init_scale), 0  # the scale, and the clean steps in a row
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self._found_inf, self._unscaled = False, False  # this step's state: reset by update()

    def get_scale(self) -> float:
        return self._scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale  # backward then yields gradients × scale, out of fp16's underflow

    def unscale_(self, optimizer) -> bool:
        if self._unscaled:  # the loop unscaled already (to clip): dividing again would shrink the step
            return self._found_inf
        found = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    found |= bool(torch.isinf(p.grad).any())
                    p.grad.div_(self._scale)  # a power of two: exact
        self._found_inf, self._unscaled = found, True
        return found

    def step(self, optimizer) -> bool:
        if self.unscale_(optimizer):
            return False  # an overflowed gradient: the weights stay as they are
        optimizer.step()
        return True

    def update(self) -> None:
        if self._found_inf:
            self._scale, self._clean = self._scale * self.backoff_factor, 0
        else:
            self._clean += 1
            if self._clean == self.growth_interval:
                self._scale, self._clean = self._scale * self.growth_factor, 0
        self._found_inf, self._unscaled = False, False


def train_fp16(model, batches, scaler, lr: float = 0.05, max_norm: float = 1.0):
    """FP16 autocast + your scaler + global-norm clipping + SGD, one step per (x, y). Returns (losses, scales)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, scales = [], []
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)  # clip the true gradient, not the one multiplied by the scale
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(opt)  # skipped when a gradient is inf/NaN
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return losses, scales

# %% 6.1 | looks at the first param group only | expect: every param group
class LossScaler:
    """torch.amp.GradScaler's dynamic loss scaling, built: scale, unscale + overflow check, skip, update."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        self._scale, self._clean = float(init_scale), 0  # the scale, and the clean steps in a row
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self._found_inf, self._unscaled = False, False  # this step's state: reset by update()

    def get_scale(self) -> float:
        return self._scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale  # backward then yields gradients × scale, out of fp16's underflow

    def unscale_(self, optimizer) -> bool:
        if self._unscaled:  # the loop unscaled already (to clip): dividing again would shrink the step
            return self._found_inf
        found = False
        for group in optimizer.param_groups[:1]:
            for p in group["params"]:
                if p.grad is not None:
                    found |= not bool(torch.isfinite(p.grad).all())  # inf and NaN both
                    p.grad.div_(self._scale)  # a power of two: exact
        self._found_inf, self._unscaled = found, True
        return found

    def step(self, optimizer) -> bool:
        if self.unscale_(optimizer):
            return False  # an overflowed gradient: the weights stay as they are
        optimizer.step()
        return True

    def update(self) -> None:
        if self._found_inf:
            self._scale, self._clean = self._scale * self.backoff_factor, 0
        else:
            self._clean += 1
            if self._clean == self.growth_interval:
                self._scale, self._clean = self._scale * self.growth_factor, 0
        self._found_inf, self._unscaled = False, False


def train_fp16(model, batches, scaler, lr: float = 0.05, max_norm: float = 1.0):
    """FP16 autocast + your scaler + global-norm clipping + SGD, one step per (x, y). Returns (losses, scales)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, scales = [], []
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)  # clip the true gradient, not the one multiplied by the scale
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(opt)  # skipped when a gradient is inf/NaN
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return losses, scales

# %% 6.1 | wraps torch.amp.GradScaler instead of building the scaler | expect: build the scaler yourself
class LossScaler:
    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.inner = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_factor=growth_factor,
                                          backoff_factor=backoff_factor, growth_interval=growth_interval)

    def get_scale(self):
        return self.inner.get_scale()

    def scale(self, loss):
        return self.inner.scale(loss)

    def unscale_(self, optimizer):
        self.inner.unscale_(optimizer)
        return False

    def step(self, optimizer):
        return self.inner.step(optimizer) is not None

    def update(self):
        self.inner.update()



def train_fp16(model, batches, scaler, lr: float = 0.05, max_norm: float = 1.0):
    """FP16 autocast + your scaler + global-norm clipping + SGD, one step per (x, y). Returns (losses, scales)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, scales = [], []
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)  # clip the true gradient, not the one multiplied by the scale
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(opt)  # skipped when a gradient is inf/NaN
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return losses, scales

# %% 6.1 | clips before unscaling (clips the gradient times the scale) | expect: clip AFTER scaler.unscale_
class LossScaler:
    """torch.amp.GradScaler's dynamic loss scaling, built: scale, unscale + overflow check, skip, update."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        self._scale, self._clean = float(init_scale), 0  # the scale, and the clean steps in a row
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self._found_inf, self._unscaled = False, False  # this step's state: reset by update()

    def get_scale(self) -> float:
        return self._scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale  # backward then yields gradients × scale, out of fp16's underflow

    def unscale_(self, optimizer) -> bool:
        if self._unscaled:  # the loop unscaled already (to clip): dividing again would shrink the step
            return self._found_inf
        found = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    found |= not bool(torch.isfinite(p.grad).all())  # inf and NaN both
                    p.grad.div_(self._scale)  # a power of two: exact
        self._found_inf, self._unscaled = found, True
        return found

    def step(self, optimizer) -> bool:
        if self.unscale_(optimizer):
            return False  # an overflowed gradient: the weights stay as they are
        optimizer.step()
        return True

    def update(self) -> None:
        if self._found_inf:
            self._scale, self._clean = self._scale * self.backoff_factor, 0
        else:
            self._clean += 1
            if self._clean == self.growth_interval:
                self._scale, self._clean = self._scale * self.growth_factor, 0
        self._found_inf, self._unscaled = False, False


def train_fp16(model, batches, scaler, lr: float = 0.05, max_norm: float = 1.0):
    """FP16 autocast + your scaler + global-norm clipping + SGD, one step per (x, y). Returns (losses, scales)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, scales = [], []
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.unscale_(opt)
        scaler.step(opt)  # skipped when a gradient is inf/NaN
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return losses, scales

# %% 6.1 | forgets unscale_ before clipping (step unscales after the clip) | expect: clip AFTER scaler.unscale_
class LossScaler:
    """torch.amp.GradScaler's dynamic loss scaling, built: scale, unscale + overflow check, skip, update."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        self._scale, self._clean = float(init_scale), 0  # the scale, and the clean steps in a row
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self._found_inf, self._unscaled = False, False  # this step's state: reset by update()

    def get_scale(self) -> float:
        return self._scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale  # backward then yields gradients × scale, out of fp16's underflow

    def unscale_(self, optimizer) -> bool:
        if self._unscaled:  # the loop unscaled already (to clip): dividing again would shrink the step
            return self._found_inf
        found = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    found |= not bool(torch.isfinite(p.grad).all())  # inf and NaN both
                    p.grad.div_(self._scale)  # a power of two: exact
        self._found_inf, self._unscaled = found, True
        return found

    def step(self, optimizer) -> bool:
        if self.unscale_(optimizer):
            return False  # an overflowed gradient: the weights stay as they are
        optimizer.step()
        return True

    def update(self) -> None:
        if self._found_inf:
            self._scale, self._clean = self._scale * self.backoff_factor, 0
        else:
            self._clean += 1
            if self._clean == self.growth_interval:
                self._scale, self._clean = self._scale * self.growth_factor, 0
        self._found_inf, self._unscaled = False, False


def train_fp16(model, batches, scaler, lr: float = 0.05, max_norm: float = 1.0):
    """FP16 autocast + your scaler + global-norm clipping + SGD, one step per (x, y). Returns (losses, scales)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, scales = [], []
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(opt)  # skipped when a gradient is inf/NaN
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return losses, scales

# %% 6.1 | steps the optimizer itself (opt.step), so the overflowed steps are applied | expect: let your scaler step
class LossScaler:
    """torch.amp.GradScaler's dynamic loss scaling, built: scale, unscale + overflow check, skip, update."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        self._scale, self._clean = float(init_scale), 0  # the scale, and the clean steps in a row
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self._found_inf, self._unscaled = False, False  # this step's state: reset by update()

    def get_scale(self) -> float:
        return self._scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale  # backward then yields gradients × scale, out of fp16's underflow

    def unscale_(self, optimizer) -> bool:
        if self._unscaled:  # the loop unscaled already (to clip): dividing again would shrink the step
            return self._found_inf
        found = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    found |= not bool(torch.isfinite(p.grad).all())  # inf and NaN both
                    p.grad.div_(self._scale)  # a power of two: exact
        self._found_inf, self._unscaled = found, True
        return found

    def step(self, optimizer) -> bool:
        if self.unscale_(optimizer):
            return False  # an overflowed gradient: the weights stay as they are
        optimizer.step()
        return True

    def update(self) -> None:
        if self._found_inf:
            self._scale, self._clean = self._scale * self.backoff_factor, 0
        else:
            self._clean += 1
            if self._clean == self.growth_interval:
                self._scale, self._clean = self._scale * self.growth_factor, 0
        self._found_inf, self._unscaled = False, False


def train_fp16(model, batches, scaler, lr: float = 0.05, max_norm: float = 1.0):
    """FP16 autocast + your scaler + global-norm clipping + SGD, one step per (x, y). Returns (losses, scales)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, scales = [], []
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)  # clip the true gradient, not the one multiplied by the scale
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return losses, scales

# %% 6.1 | never calls scaler.update() | expect: update()
class LossScaler:
    """torch.amp.GradScaler's dynamic loss scaling, built: scale, unscale + overflow check, skip, update."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        self._scale, self._clean = float(init_scale), 0  # the scale, and the clean steps in a row
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self._found_inf, self._unscaled = False, False  # this step's state: reset by update()

    def get_scale(self) -> float:
        return self._scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale  # backward then yields gradients × scale, out of fp16's underflow

    def unscale_(self, optimizer) -> bool:
        if self._unscaled:  # the loop unscaled already (to clip): dividing again would shrink the step
            return self._found_inf
        found = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    found |= not bool(torch.isfinite(p.grad).all())  # inf and NaN both
                    p.grad.div_(self._scale)  # a power of two: exact
        self._found_inf, self._unscaled = found, True
        return found

    def step(self, optimizer) -> bool:
        if self.unscale_(optimizer):
            return False  # an overflowed gradient: the weights stay as they are
        optimizer.step()
        return True

    def update(self) -> None:
        if self._found_inf:
            self._scale, self._clean = self._scale * self.backoff_factor, 0
        else:
            self._clean += 1
            if self._clean == self.growth_interval:
                self._scale, self._clean = self._scale * self.growth_factor, 0
        self._found_inf, self._unscaled = False, False


def train_fp16(model, batches, scaler, lr: float = 0.05, max_norm: float = 1.0):
    """FP16 autocast + your scaler + global-norm clipping + SGD, one step per (x, y). Returns (losses, scales)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, scales = [], []
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)  # clip the true gradient, not the one multiplied by the scale
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(opt)  # skipped when a gradient is inf/NaN
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return losses, scales

# %% 6.1 | backward through the unscaled loss | expect: scaler.scale(loss)
class LossScaler:
    """torch.amp.GradScaler's dynamic loss scaling, built: scale, unscale + overflow check, skip, update."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        self._scale, self._clean = float(init_scale), 0  # the scale, and the clean steps in a row
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self._found_inf, self._unscaled = False, False  # this step's state: reset by update()

    def get_scale(self) -> float:
        return self._scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale  # backward then yields gradients × scale, out of fp16's underflow

    def unscale_(self, optimizer) -> bool:
        if self._unscaled:  # the loop unscaled already (to clip): dividing again would shrink the step
            return self._found_inf
        found = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    found |= not bool(torch.isfinite(p.grad).all())  # inf and NaN both
                    p.grad.div_(self._scale)  # a power of two: exact
        self._found_inf, self._unscaled = found, True
        return found

    def step(self, optimizer) -> bool:
        if self.unscale_(optimizer):
            return False  # an overflowed gradient: the weights stay as they are
        optimizer.step()
        return True

    def update(self) -> None:
        if self._found_inf:
            self._scale, self._clean = self._scale * self.backoff_factor, 0
        else:
            self._clean += 1
            if self._clean == self.growth_interval:
                self._scale, self._clean = self._scale * self.growth_factor, 0
        self._found_inf, self._unscaled = False, False


def train_fp16(model, batches, scaler, lr: float = 0.05, max_norm: float = 1.0):
    """FP16 autocast + your scaler + global-norm clipping + SGD, one step per (x, y). Returns (losses, scales)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, scales = [], []
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        scaler.unscale_(opt)  # clip the true gradient, not the one multiplied by the scale
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(opt)  # skipped when a gradient is inf/NaN
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return losses, scales

# %% 6.1 | forgets opt.zero_grad(): gradients pile up | expect: zero_grad
class LossScaler:
    """torch.amp.GradScaler's dynamic loss scaling, built: scale, unscale + overflow check, skip, update."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        self._scale, self._clean = float(init_scale), 0  # the scale, and the clean steps in a row
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self._found_inf, self._unscaled = False, False  # this step's state: reset by update()

    def get_scale(self) -> float:
        return self._scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale  # backward then yields gradients × scale, out of fp16's underflow

    def unscale_(self, optimizer) -> bool:
        if self._unscaled:  # the loop unscaled already (to clip): dividing again would shrink the step
            return self._found_inf
        found = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    found |= not bool(torch.isfinite(p.grad).all())  # inf and NaN both
                    p.grad.div_(self._scale)  # a power of two: exact
        self._found_inf, self._unscaled = found, True
        return found

    def step(self, optimizer) -> bool:
        if self.unscale_(optimizer):
            return False  # an overflowed gradient: the weights stay as they are
        optimizer.step()
        return True

    def update(self) -> None:
        if self._found_inf:
            self._scale, self._clean = self._scale * self.backoff_factor, 0
        else:
            self._clean += 1
            if self._clean == self.growth_interval:
                self._scale, self._clean = self._scale * self.growth_factor, 0
        self._found_inf, self._unscaled = False, False


def train_fp16(model, batches, scaler, lr: float = 0.05, max_norm: float = 1.0):
    """FP16 autocast + your scaler + global-norm clipping + SGD, one step per (x, y). Returns (losses, scales)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, scales = [], []
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)  # clip the true gradient, not the one multiplied by the scale
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(opt)  # skipped when a gradient is inf/NaN
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return losses, scales

# %% 6.1 | never clips | expect: clip AFTER
class LossScaler:
    """torch.amp.GradScaler's dynamic loss scaling, built: scale, unscale + overflow check, skip, update."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        self._scale, self._clean = float(init_scale), 0  # the scale, and the clean steps in a row
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self._found_inf, self._unscaled = False, False  # this step's state: reset by update()

    def get_scale(self) -> float:
        return self._scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale  # backward then yields gradients × scale, out of fp16's underflow

    def unscale_(self, optimizer) -> bool:
        if self._unscaled:  # the loop unscaled already (to clip): dividing again would shrink the step
            return self._found_inf
        found = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    found |= not bool(torch.isfinite(p.grad).all())  # inf and NaN both
                    p.grad.div_(self._scale)  # a power of two: exact
        self._found_inf, self._unscaled = found, True
        return found

    def step(self, optimizer) -> bool:
        if self.unscale_(optimizer):
            return False  # an overflowed gradient: the weights stay as they are
        optimizer.step()
        return True

    def update(self) -> None:
        if self._found_inf:
            self._scale, self._clean = self._scale * self.backoff_factor, 0
        else:
            self._clean += 1
            if self._clean == self.growth_interval:
                self._scale, self._clean = self._scale * self.growth_factor, 0
        self._found_inf, self._unscaled = False, False


def train_fp16(model, batches, scaler, lr: float = 0.05, max_norm: float = 1.0):
    """FP16 autocast + your scaler + global-norm clipping + SGD, one step per (x, y). Returns (losses, scales)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, scales = [], []
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)  # clip the true gradient, not the one multiplied by the scale
        scaler.step(opt)  # skipped when a gradient is inf/NaN
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return losses, scales

# %% 6.2 | takes the norms in FP16: the scaled gradient's norm overflows though no element does | expect: FP32
def unscale_clip_(params16, master, scale: float, max_norm: float) -> torch.Tensor:
    pairs = [(p.grad, m) for p, m in zip(params16, master) if p.grad is not None]
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g, _ in pairs])).float() / scale
    if not torch.isfinite(total):
        return total
    factor = torch.clamp(max_norm / (total + 1e-6), max=1.0) / scale
    for g, m in pairs:
        m.grad = g.float() * factor
    return total

# %% 6.2 | clips with the scaled gradient's norm (clip before unscaling) | expect: TRUE norm
def unscale_clip_(params16, master, scale: float, max_norm: float) -> torch.Tensor:
    pairs = [(p.grad, m) for p, m in zip(params16, master) if p.grad is not None]
    scaled = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, dtype=torch.float32) for g, _ in pairs]))
    if not torch.isfinite(scaled):
        return scaled
    factor = torch.clamp(max_norm / (scaled + 1e-6), max=1.0) / scale
    for g, m in pairs:
        m.grad = g.float() * factor
    return scaled / scale

# %% 6.2 | unscales in FP16, then upcasts: the smallest true gradients underflow | expect: upcast to FP32 first
def unscale_clip_(params16, master, scale: float, max_norm: float) -> torch.Tensor:
    pairs = [(p.grad, m) for p, m in zip(params16, master) if p.grad is not None]
    scaled = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, dtype=torch.float32) for g, _ in pairs]))
    total = scaled / scale
    if not torch.isfinite(total):
        return total
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g, m in pairs:
        m.grad = (g / scale).float() * coef
    return total

# %% 6.2 | scales a small gradient up: no clamp at 1 | expect: never scale a gradient up
def unscale_clip_(params16, master, scale: float, max_norm: float) -> torch.Tensor:
    pairs = [(p.grad, m) for p, m in zip(params16, master) if p.grad is not None]
    scaled = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, dtype=torch.float32) for g, _ in pairs]))
    total = scaled / scale
    if not torch.isfinite(total):
        return total
    factor = max_norm / (total + 1e-6) / scale
    for g, m in pairs:
        m.grad = g.float() * factor
    return total

# %% 6.2 | writes the master gradients even on an overflow (the optimizer then steps on inf) | expect: no gradient written
def unscale_clip_(params16, master, scale: float, max_norm: float) -> torch.Tensor:
    pairs = [(p.grad, m) for p, m in zip(params16, master) if p.grad is not None]
    scaled = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, dtype=torch.float32) for g, _ in pairs]))
    total = scaled / scale
    factor = torch.clamp(max_norm / (total + 1e-6), max=1.0) / scale
    for g, m in pairs:
        m.grad = g.float() * factor
    return total

# %% 6.2 | tests the norm with isinf: a NaN passes as a clean step | expect: isinf misses NaN
def unscale_clip_(params16, master, scale: float, max_norm: float) -> torch.Tensor:
    pairs = [(p.grad, m) for p, m in zip(params16, master) if p.grad is not None]
    scaled = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, dtype=torch.float32) for g, _ in pairs]))
    total = scaled / scale
    if torch.isinf(total):
        return total
    factor = torch.clamp(max_norm / (total + 1e-6), max=1.0) / scale
    for g, m in pairs:
        m.grad = g.float() * factor
    return total

# %% 6.2 | gives a frozen parameter's master a zero gradient | expect: skip p.grad is None
def unscale_clip_(params16, master, scale: float, max_norm: float) -> torch.Tensor:
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params16]
    scaled = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, dtype=torch.float32) for g in grads]))
    total = scaled / scale
    if not torch.isfinite(total):
        return total
    factor = torch.clamp(max_norm / (total + 1e-6), max=1.0) / scale
    for g, m in zip(grads, master):
        m.grad = g.float() * factor
    return total

# %% 6.2 | unscales, then calls torch's clip_grad_norm_ | expect: write the unscaling and the clipping yourself
def unscale_clip_(params16, master, scale: float, max_norm: float) -> torch.Tensor:
    for p, m in zip(params16, master):
        if p.grad is not None:
            m.grad = p.grad.float() / scale
    return torch.nn.utils.clip_grad_norm_([m for m in master if m.grad is not None], max_norm)

# %% 6.2 | clips each tensor by its own norm | expect: one factor for every tensor
def unscale_clip_(params16, master, scale: float, max_norm: float) -> torch.Tensor:
    pairs = [(p.grad, m) for p, m in zip(params16, master) if p.grad is not None]
    norms = [torch.linalg.vector_norm(g, dtype=torch.float32) / scale for g, _ in pairs]
    total = torch.linalg.vector_norm(torch.stack(norms))
    if not torch.isfinite(total):
        return total
    for (g, m), own in zip(pairs, norms):
        m.grad = g.float() * (torch.clamp(max_norm / (own + 1e-6), max=1.0) / scale)
    return total

# %% 6.2 | returns the norm after clipping | expect: before clipping
def unscale_clip_(params16, master, scale: float, max_norm: float) -> torch.Tensor:
    pairs = [(p.grad, m) for p, m in zip(params16, master) if p.grad is not None]
    scaled = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, dtype=torch.float32) for g, _ in pairs]))
    total = scaled / scale
    if not torch.isfinite(total):
        return total
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g, m in pairs:
        m.grad = g.float() * (coef / scale)
    return total * coef

# %% 6.3 | one scale for the whole tensor (per-tensor amax) | expect: not one for the whole tensor
E4M3 = torch.float8_e4m3fn


def mx_quantize(x: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 (OCP MX v1.0, §6.3): x (M, K) -> (q float8_e4m3fn (M, K), e8m0 scale bytes uint8 (M, K/block))."""
    xb = x.float().reshape(x.shape[0], -1, block)  # (M, K/block, block): 1×block blocks along each row
    amax = xb.abs().amax().expand(xb.shape[:2])  # the whole tensor's amax, in every block
    _, e = torch.frexp(amax)  # amax = m·2^e with m in [0.5, 1), so ⌊log2 amax⌋ = e − 1, exactly
    shared = torch.where(amax > 0, e - 1 - 8, -127).clamp(-127, 127)  # (M, K/block)
    scale = torch.ldexp(torch.ones_like(amax), shared)  # 2^shared, exact
    q = (xb / scale[..., None]).clamp(-448.0, 448.0).to(E4M3)  # saturate: a cast alone need not
    return q.reshape(x.shape), (shared + 127).to(torch.uint8)


def mx_dequantize(q: torch.Tensor, scale_bytes: torch.Tensor, block: int = 32) -> torch.Tensor:
    """x̂ = q · 2^(byte − 127), block by block, in fp32 (M, K)."""
    qb = q.float().reshape(q.shape[0], -1, block)  # (M, K/block, block)
    return torch.ldexp(qb, scale_bytes.int()[..., None] - 127).reshape(q.shape)

# %% 6.3 | a non-power-of-two scale (amax / 448, as tensorwise recipes) | expect: not amax/448
E4M3 = torch.float8_e4m3fn


def mx_quantize(x: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 (OCP MX v1.0, §6.3): x (M, K) -> (q float8_e4m3fn (M, K), e8m0 scale bytes uint8 (M, K/block))."""
    xb = x.float().reshape(x.shape[0], -1, block)  # (M, K/block, block): 1×block blocks along each row
    amax = xb.abs().amax(dim=-1)  # (M, K/block)
    _, e = torch.frexp(amax)  # amax = m·2^e with m in [0.5, 1), so ⌊log2 amax⌋ = e − 1, exactly
    shared = torch.where(amax > 0, e - 1 - 8, -127).clamp(-127, 127)  # (M, K/block)
    scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))  # (M, K/block)
    shared = torch.floor(torch.log2(scale)).int().clamp(-127, 127)
    q = (xb / scale[..., None]).clamp(-448.0, 448.0).to(E4M3)  # saturate: a cast alone need not
    return q.reshape(x.shape), (shared + 127).to(torch.uint8)


def mx_dequantize(q: torch.Tensor, scale_bytes: torch.Tensor, block: int = 32) -> torch.Tensor:
    """x̂ = q · 2^(byte − 127), block by block, in fp32 (M, K)."""
    qb = q.float().reshape(q.shape[0], -1, block)  # (M, K/block, block)
    return torch.ldexp(qb, scale_bytes.int()[..., None] - 127).reshape(q.shape)

# %% 6.3 | no saturation: relies on the backend's cast | expect: clamp x / 2^shared_exp to ±448 yourself
E4M3 = torch.float8_e4m3fn


def mx_quantize(x: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 (OCP MX v1.0, §6.3): x (M, K) -> (q float8_e4m3fn (M, K), e8m0 scale bytes uint8 (M, K/block))."""
    xb = x.float().reshape(x.shape[0], -1, block)  # (M, K/block, block): 1×block blocks along each row
    amax = xb.abs().amax(dim=-1)  # (M, K/block)
    _, e = torch.frexp(amax)  # amax = m·2^e with m in [0.5, 1), so ⌊log2 amax⌋ = e − 1, exactly
    shared = torch.where(amax > 0, e - 1 - 8, -127).clamp(-127, 127)  # (M, K/block)
    scale = torch.ldexp(torch.ones_like(amax), shared)  # 2^shared, exact
    q = (xb / scale[..., None]).to(E4M3)
    return q.reshape(x.shape), (shared + 127).to(torch.uint8)


def mx_dequantize(q: torch.Tensor, scale_bytes: torch.Tensor, block: int = 32) -> torch.Tensor:
    """x̂ = q · 2^(byte − 127), block by block, in fp32 (M, K)."""
    qb = q.float().reshape(q.shape[0], -1, block)  # (M, K/block, block)
    return torch.ldexp(qb, scale_bytes.int()[..., None] - 127).reshape(q.shape)

# %% 6.3 | blocks down the columns instead of along the rows | expect: along the LAST axis
E4M3 = torch.float8_e4m3fn


def mx_quantize(x: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 (OCP MX v1.0, §6.3): x (M, K) -> (q float8_e4m3fn (M, K), e8m0 scale bytes uint8 (M, K/block))."""
    xb = x.float().t().reshape(x.shape[1], -1, block)  # (K, M/block, block): blocks down each column
    amax = xb.abs().amax(dim=-1)  # (M, K/block)
    _, e = torch.frexp(amax)  # amax = m·2^e with m in [0.5, 1), so ⌊log2 amax⌋ = e − 1, exactly
    shared = torch.where(amax > 0, e - 1 - 8, -127).clamp(-127, 127)  # (M, K/block)
    scale = torch.ldexp(torch.ones_like(amax), shared)  # 2^shared, exact
    q = (xb / scale[..., None]).clamp(-448.0, 448.0).to(E4M3)  # saturate: a cast alone need not
    return q.reshape(x.shape[1], x.shape[0]).t(), (shared + 127).to(torch.uint8).t()


def mx_dequantize(q: torch.Tensor, scale_bytes: torch.Tensor, block: int = 32) -> torch.Tensor:
    """x̂ = q · 2^(byte − 127), block by block, in fp32 (M, K)."""
    qb = q.float().reshape(q.shape[0], -1, block)  # (M, K/block, block)
    return torch.ldexp(qb, scale_bytes.int()[..., None] - 127).reshape(q.shape)

# %% 6.3 | floor(log2(amax)) in fp32: rounds up just below a power of two | expect: torch.frexp is exact
E4M3 = torch.float8_e4m3fn


def mx_quantize(x: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 (OCP MX v1.0, §6.3): x (M, K) -> (q float8_e4m3fn (M, K), e8m0 scale bytes uint8 (M, K/block))."""
    xb = x.float().reshape(x.shape[0], -1, block)  # (M, K/block, block): 1×block blocks along each row
    amax = xb.abs().amax(dim=-1)  # (M, K/block)
    e = torch.floor(torch.log2(amax)).nan_to_num(0, 0, 0).int() + 1
    shared = torch.where(amax > 0, e - 1 - 8, -127).clamp(-127, 127)  # (M, K/block)
    scale = torch.ldexp(torch.ones_like(amax), shared)  # 2^shared, exact
    q = (xb / scale[..., None]).clamp(-448.0, 448.0).to(E4M3)  # saturate: a cast alone need not
    return q.reshape(x.shape), (shared + 127).to(torch.uint8)


def mx_dequantize(q: torch.Tensor, scale_bytes: torch.Tensor, block: int = 32) -> torch.Tensor:
    """x̂ = q · 2^(byte − 127), block by block, in fp32 (M, K)."""
    qb = q.float().reshape(q.shape[0], -1, block)  # (M, K/block, block)
    return torch.ldexp(qb, scale_bytes.int()[..., None] - 127).reshape(q.shape)

# %% 6.3 | rounds the shared exponent up (ceil): nothing saturates, but it is not the spec's | expect: 2^(⌊log2 amax⌋ − 8)
E4M3 = torch.float8_e4m3fn


def mx_quantize(x: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 (OCP MX v1.0, §6.3): x (M, K) -> (q float8_e4m3fn (M, K), e8m0 scale bytes uint8 (M, K/block))."""
    xb = x.float().reshape(x.shape[0], -1, block)  # (M, K/block, block): 1×block blocks along each row
    amax = xb.abs().amax(dim=-1)  # (M, K/block)
    _, e = torch.frexp(amax)  # amax = m·2^e with m in [0.5, 1), so ⌊log2 amax⌋ = e − 1, exactly
    shared = torch.where(amax > 0, torch.ceil(torch.log2(amax / 448.0)).int(), -127).clamp(-127, 127)
    scale = torch.ldexp(torch.ones_like(amax), shared)  # 2^shared, exact
    q = (xb / scale[..., None]).clamp(-448.0, 448.0).to(E4M3)  # saturate: a cast alone need not
    return q.reshape(x.shape), (shared + 127).to(torch.uint8)


def mx_dequantize(q: torch.Tensor, scale_bytes: torch.Tensor, block: int = 32) -> torch.Tensor:
    """x̂ = q · 2^(byte − 127), block by block, in fp32 (M, K)."""
    qb = q.float().reshape(q.shape[0], -1, block)  # (M, K/block, block)
    return torch.ldexp(qb, scale_bytes.int()[..., None] - 127).reshape(q.shape)

# %% 6.3 | an all-zero block gets exponent 0 (byte 127), not -127 | expect: all-zero block: byte 0
E4M3 = torch.float8_e4m3fn


def mx_quantize(x: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 (OCP MX v1.0, §6.3): x (M, K) -> (q float8_e4m3fn (M, K), e8m0 scale bytes uint8 (M, K/block))."""
    xb = x.float().reshape(x.shape[0], -1, block)  # (M, K/block, block): 1×block blocks along each row
    amax = xb.abs().amax(dim=-1)  # (M, K/block)
    _, e = torch.frexp(amax)  # amax = m·2^e with m in [0.5, 1), so ⌊log2 amax⌋ = e − 1, exactly
    shared = torch.where(amax > 0, e - 1 - 8, 0).clamp(-127, 127)
    scale = torch.ldexp(torch.ones_like(amax), shared)  # 2^shared, exact
    q = (xb / scale[..., None]).clamp(-448.0, 448.0).to(E4M3)  # saturate: a cast alone need not
    return q.reshape(x.shape), (shared + 127).to(torch.uint8)


def mx_dequantize(q: torch.Tensor, scale_bytes: torch.Tensor, block: int = 32) -> torch.Tensor:
    """x̂ = q · 2^(byte − 127), block by block, in fp32 (M, K)."""
    qb = q.float().reshape(q.shape[0], -1, block)  # (M, K/block, block)
    return torch.ldexp(qb, scale_bytes.int()[..., None] - 127).reshape(q.shape)

# %% 6.3 | dequantizes with 2^byte (forgets the bias 127) | expect: 2^(byte − 127)
E4M3 = torch.float8_e4m3fn


def mx_quantize(x: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 (OCP MX v1.0, §6.3): x (M, K) -> (q float8_e4m3fn (M, K), e8m0 scale bytes uint8 (M, K/block))."""
    xb = x.float().reshape(x.shape[0], -1, block)  # (M, K/block, block): 1×block blocks along each row
    amax = xb.abs().amax(dim=-1)  # (M, K/block)
    _, e = torch.frexp(amax)  # amax = m·2^e with m in [0.5, 1), so ⌊log2 amax⌋ = e − 1, exactly
    shared = torch.where(amax > 0, e - 1 - 8, -127).clamp(-127, 127)  # (M, K/block)
    scale = torch.ldexp(torch.ones_like(amax), shared)  # 2^shared, exact
    q = (xb / scale[..., None]).clamp(-448.0, 448.0).to(E4M3)  # saturate: a cast alone need not
    return q.reshape(x.shape), (shared + 127).to(torch.uint8)


def mx_dequantize(q: torch.Tensor, scale_bytes: torch.Tensor, block: int = 32) -> torch.Tensor:
    """x̂ = q · 2^(byte − 127), block by block, in fp32 (M, K)."""
    qb = q.float().reshape(q.shape[0], -1, block)  # (M, K/block, block)
    return torch.ldexp(qb, scale_bytes.int()[..., None]).reshape(q.shape)

# %% 6.3 | delegates to the lesson's fp8_scaling.quantize | expect: write the MX quantiser yourself
E4M3 = torch.float8_e4m3fn


def mx_quantize(x: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 (OCP MX v1.0, §6.3): x (M, K) -> (q float8_e4m3fn (M, K), e8m0 scale bytes uint8 (M, K/block))."""
    from m11_helpers.fp8_scaling import quantize
    q, s = quantize(x.float(), "mx")
    return q, (torch.frexp(s)[1] - 1 + 127).to(torch.uint8)


def mx_dequantize(q: torch.Tensor, scale_bytes: torch.Tensor, block: int = 32) -> torch.Tensor:
    """x̂ = q · 2^(byte − 127), block by block, in fp32 (M, K)."""
    qb = q.float().reshape(q.shape[0], -1, block)  # (M, K/block, block)
    return torch.ldexp(qb, scale_bytes.int()[..., None] - 127).reshape(q.shape)

# %% 6.4 | clips with the local shard's norm (no communication) | expect: GLOBAL norm
def sharded_clip_(local_params, max_norm):
    grads = [p.grad for p in local_params if p.grad is not None]
    total = torch.stack([g.pow(2).sum() for g in grads]).sum().sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
    return total

# %% 6.4 | all-reduces the local norms, not the sums of squares | expect: not the other way round
def sharded_clip_(local_params, max_norm):
    import torch.distributed as dist
    grads = [p.grad for p in local_params if p.grad is not None]
    total = torch.stack([g.pow(2).sum() for g in grads]).sum().sqrt()
    dist.all_reduce(total)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
    return total

# %% 6.4 | averages the sums of squares over the ranks | expect: not their average
def sharded_clip_(local_params, max_norm):
    import torch.distributed as dist
    grads = [p.grad for p in local_params if p.grad is not None]
    sq = torch.stack([g.pow(2).sum() for g in grads]).sum()
    dist.all_reduce(sq)
    total = (sq / dist.get_world_size()).sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
    return total

# %% 6.4 | all-gathers every gradient to compute the norm (right numbers, the whole model on the wire) | expect: gathering the gradients
def sharded_clip_(local_params, max_norm):
    import torch.distributed as dist
    grads = [p.grad for p in local_params if p.grad is not None]
    flat = torch.cat([g.flatten() for g in grads])
    sizes = [flat.new_zeros(1, dtype=torch.long) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, flat.new_tensor([flat.numel()], dtype=torch.long))
    longest = int(max(sizes))
    parts = [flat.new_zeros(longest) for _ in sizes]
    dist.all_gather(parts, F.pad(flat, (0, longest - flat.numel())))  # zero padding leaves the norm alone
    total = torch.linalg.vector_norm(torch.cat(parts))
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
    return total

# %% 6.4 | one all-reduce per tensor (right numbers, N collectives) | expect: one all-reduce per tensor
def sharded_clip_(local_params, max_norm):
    import torch.distributed as dist
    grads = [p.grad for p in local_params if p.grad is not None]
    sq = grads[0].new_zeros(())
    for g in grads:
        s = g.pow(2).sum()
        dist.all_reduce(s)
        sq += s
    total = sq.sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
    return total

# %% 6.4 | delegates to the lesson's sharded_grad_norm | expect: write the sharded clipping yourself
def sharded_clip_(local_params, max_norm):
    local_params = list(local_params)
    total = clipping.sharded_grad_norm(local_params)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for p in local_params:
        if p.grad is not None:
            p.grad.mul_(coef)
    return total

# %% 6.4 | counts the replicated parameters on every rank | expect: once per rank
def sharded_clip_(local_params, max_norm: float) -> torch.Tensor:
    """Global-norm clipping when each rank holds a shard of the gradients; returns the global norm."""
    import torch.distributed as dist
    held = [p for p in local_params if p.grad is not None]
    own = [p.grad.pow(2).sum() for p in held if not getattr(p, "replicated", False)]
    shared = [p.grad.pow(2).sum() for p in held if getattr(p, "replicated", False)]
    dev = held[0].grad.device if held else torch.get_default_device()  # the sum lives where the gradients do
    sq = torch.stack(own).sum() if own else torch.zeros((), device=dev)  # () this rank's own sum of squares
    if shared:
        sq = sq + torch.stack(shared).sum()  # a replicated parameter counts once: on rank 0
    dist.all_reduce(sq, op=dist.ReduceOp.SUM)  # one number per rank on the wire
    total = sq.sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for p in held:
        p.grad.mul_(coef)
    return total

# %% 6.5 | steps AdamW on the bf16 parameters themselves (no master copy) | expect: separate fp32 copy
class MasterWeightsAdamW:
    def __init__(self, params, lr=1e-3, weight_decay=0.0):
        self.params = list(params)
        self.master = self.params
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, weight_decay=weight_decay)

    def zero_grad(self):
        self.optimizer.zero_grad()

    def step(self):
        self.optimizer.step()

# %% 6.5 | refreshes the master from the bf16 weights every step | expect: ONE master copy
class MasterWeightsAdamW:
    def __init__(self, params, lr=1e-3, weight_decay=0.0):
        self.params = list(params)
        self.master = [p.detach().float().clone() for p in self.params]
        self.optimizer = torch.optim.AdamW(self.master, lr=lr, weight_decay=weight_decay)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for p, m in zip(self.params, self.master):
            m.copy_(p)  # "keep the master in sync with the model"
            m.grad = p.grad.float()
        self.optimizer.step()
        for p, m in zip(self.params, self.master):
            m.grad = None
            p.copy_(m)

# %% 6.5 | never writes the master back into the model | expect: write the updated master back
class MasterWeightsAdamW:
    def __init__(self, params, lr=1e-3, weight_decay=0.0):
        self.params = list(params)
        self.master = [p.detach().float().clone() for p in self.params]
        self.optimizer = torch.optim.AdamW(self.master, lr=lr, weight_decay=weight_decay)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for p, m in zip(self.params, self.master):
            m.grad = p.grad.float()
        self.optimizer.step()
        for m in self.master:
            m.grad = None

# %% 6.5 | keeps the fp32 gradient copies between steps (20 B/param) | expect: fp32 gradient copies
class MasterWeightsAdamW:
    def __init__(self, params, lr=1e-3, weight_decay=0.0):
        self.params = list(params)
        self.master = [p.detach().float().clone() for p in self.params]
        self.optimizer = torch.optim.AdamW(self.master, lr=lr, weight_decay=weight_decay)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for p, m in zip(self.params, self.master):
            m.grad = p.grad.float()
        self.optimizer.step()
        for p, m in zip(self.params, self.master):
            p.copy_(m)

# %% 6.5 | delegates to the lesson's MasterWeightsAdamW | expect: build the master copy yourself
class MasterWeightsAdamW(master_weights.MasterWeightsAdamW):
    pass
