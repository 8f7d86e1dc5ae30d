"""PyTorch/numpy reference for kiln's sampling layer (src/pipeline/).

Written from the definitions, independently of the C++:

  RNG         torch's own CPU generator (torch.randn) is the reference for
              ``--rng cpu``; ``PhiloxGenerator`` is stable-diffusion-webui's
              modules/rng_philox.py (numpy) for ``--rng cuda``.
  schedule    ``DiscreteSchedule``: ldm's scaled-linear betas (float64, stored
              float32 like an SD checkpoint's alphas_cumprod) and
              k-diffusion's DiscreteSchedule sigma table / sigma_to_t /
              t_to_sigma; ``get_scalings`` for eps and v prediction.
  schedulers  ``get_sigmas``: k-diffusion get_sigmas / get_sigmas_karras /
              get_sigmas_exponential, NVIDIA's Align Your Steps howto
              (loglinear_interp), ComfyUI's sgm_uniform and simple_scheduler.
  samplers    ``SAMPLERS``: k-diffusion's sample_euler, sample_euler_ancestral,
              sample_heun, sample_dpm_2, sample_dpmpp_2s_ancestral,
              sample_dpmpp_2m, the webui-discussion-8457 dpmpp_2m_v2, ComfyUI's
              sample_lcm and sample_ipndm (zju-pi diff-solvers iPNDM without the
              final-denoise special case), and diffusers' DDIMScheduler
              (timestep_spacing="trailing") and TCDScheduler steps written out.

Samplers run in float64 on float32 inputs. Every sampler takes
``model(x, sigma) -> denoised`` and ``noise()`` returning the next noise tensor
(same shape as x), so a test can replay one fixed noise stream.
"""

import ctypes
import ctypes.util
import math

import numpy as np
import torch

# ---------------------------------------------------------------------------------------------------------------------
# RNG


def torch_cpu_randn_calls(seed, sizes):
    """torch.randn(n, generator=g) for each n in sizes, one generator seeded once: float32 numpy arrays."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g, dtype=torch.float32).numpy() for n in sizes]


PHILOX_M = [0xD2511F53, 0xCD9E8D57]
PHILOX_W = [0x9E3779B9, 0xBB67AE85]
TWO_POW32_INV = np.array([2.3283064e-10], dtype=np.float32)
TWO_POW32_INV_2PI = np.array([2.3283064e-10 * 6.2831855], dtype=np.float32)


def _uint32_pairs(x):
    """(N,) uint64 -> (2, N) uint32: row 0 the low halves, row 1 the high halves."""
    return x.view(np.uint32).reshape(-1, 2).transpose(1, 0)


def _philox4_round(counter, key):
    v1 = _uint32_pairs(counter[0].astype(np.uint64) * PHILOX_M[0])
    v2 = _uint32_pairs(counter[2].astype(np.uint64) * PHILOX_M[1])
    counter[0] = v2[1] ^ counter[1] ^ key[0]
    counter[1] = v2[0]
    counter[2] = v1[1] ^ counter[3] ^ key[1]
    counter[3] = v1[0]


def philox4_32(counter, key, rounds=10):
    for _ in range(rounds - 1):
        _philox4_round(counter, key)
        key[0] = key[0] + np.uint32(PHILOX_W[0])
        key[1] = key[1] + np.uint32(PHILOX_W[1])
    _philox4_round(counter, key)
    return counter


def philox_box_muller(x, y):
    """The sine half of Box-Muller; uint32 * float32 arrays promote to float64 in numpy."""
    u = x * TWO_POW32_INV + TWO_POW32_INV / 2
    v = y * TWO_POW32_INV_2PI + TWO_POW32_INV_2PI / 2
    s = np.sqrt(-2.0 * np.log(u))
    return (s * np.sin(v)).astype(np.float32)


class PhiloxGenerator:
    """webui's emulation of torch.randn(..., device="cuda"): counter {offset, 0, i, 0}, key = seed."""

    def __init__(self, seed):
        self.seed = seed
        self.offset = 0

    def randn(self, n):
        counter = np.zeros((4, n), dtype=np.uint32)
        counter[0] = self.offset
        counter[2] = np.arange(n, dtype=np.uint32)
        self.offset += 1
        key = np.empty(n, dtype=np.uint64)
        key.fill(self.seed)
        key = _uint32_pairs(key).copy()
        g = philox4_32(counter, key)
        return philox_box_muller(g[0], g[1])


# ---------------------------------------------------------------------------------------------------------------------
# Discrete DDPM schedule and denoiser scalings


class StdDefaultGenerator:
    """sd-cli's --rng std_default (STDDefaultRNG), written from GCC libstdc++'s <random>: minstd_rand0
    (x = 16807 x mod 2^31 - 1, seeded with the seed's low 32 bits), generate_canonical<float, 24> (one draw,
    float(x - 1) / float(2^31 - 2) in float32, where the divisor rounds to 2^31) and normal_distribution<float>'s
    polar method. sd-cli makes a new distribution per randn call, so its cached second value does not carry
    over between calls. log is glibc's logf through ctypes, the libm sd-cli calls on Linux: a correctly rounded
    log differs from it by one unit in the last place in about 0.2% of draws."""

    MODULUS = 2147483647
    _libm = ctypes.CDLL(ctypes.util.find_library("m"))
    _libm.logf.restype = ctypes.c_float
    _libm.logf.argtypes = [ctypes.c_float]

    def __init__(self, seed):
        self.state = (seed & 0xFFFFFFFF) % self.MODULUS or 1

    def _canonical(self):
        self.state = self.state * 16807 % self.MODULUS
        u = np.float32(self.state - 1) / np.float32(2147483648.0)
        return np.nextafter(np.float32(1), np.float32(0)) if u >= 1 else u

    def randn(self, n):
        out, saved = [], None
        while len(out) < n:
            if saved is not None:
                out.append(saved)
                saved = None
                continue
            while True:
                # result_type(2.0) * u - 1.0: the product in float, the difference in double, kept as float.
                x = np.float32(float(np.float32(2) * self._canonical()) - 1.0)
                y = np.float32(float(np.float32(2) * self._canonical()) - 1.0)
                r2 = np.float32(x * x) + np.float32(y * y)
                if not (r2 > 1 or r2 == 0):
                    break
            mult = np.sqrt(np.float32(np.float32(-2) * np.float32(self._libm.logf(float(r2)))) / r2)
            saved = np.float32(x * mult) + np.float32(0)
            out.append(np.float32(y * mult) + np.float32(0))
        return np.array(out, dtype=np.float32)


def scaled_linear_alphas_cumprod(beta_start=0.00085, beta_end=0.012, timesteps=1000):
    """ldm make_beta_schedule("linear") + np.cumprod in float64, registered as a float32 buffer."""
    betas = torch.linspace(beta_start ** 0.5, beta_end ** 0.5, timesteps, dtype=torch.float64) ** 2
    alphas_cumprod = np.cumprod(1.0 - betas.numpy(), axis=0)
    return torch.tensor(alphas_cumprod, dtype=torch.float32)


class DiscreteSchedule:
    """k-diffusion DiscreteSchedule over a float32 alphas_cumprod buffer (sigmas ascend with t)."""

    def __init__(self, alphas_cumprod):
        self.alphas_cumprod = alphas_cumprod.to(torch.float32)
        self.sigmas = ((1 - self.alphas_cumprod) / self.alphas_cumprod) ** 0.5
        self.log_sigmas = self.sigmas.log()

    @property
    def sigma_min(self):
        return float(self.sigmas[0])

    @property
    def sigma_max(self):
        return float(self.sigmas[-1])

    def sigma_to_t(self, sigma):
        log_sigmas = self.log_sigmas.double()
        log_sigma = math.log(sigma)
        dists = log_sigma - log_sigmas
        low_idx = int(dists.ge(0).cumsum(dim=0).argmax(dim=0).clamp(max=log_sigmas.shape[0] - 2))
        high_idx = low_idx + 1
        low, high = float(log_sigmas[low_idx]), float(log_sigmas[high_idx])
        w = min(max((low - log_sigma) / (low - high), 0.0), 1.0)
        return (1 - w) * low_idx + w * high_idx

    def t_to_sigma(self, t):
        log_sigmas = self.log_sigmas.double()
        low_idx, high_idx = math.floor(t), math.ceil(t)
        w = t - low_idx
        return math.exp((1 - w) * float(log_sigmas[low_idx]) + w * float(log_sigmas[high_idx]))


def get_scalings(prediction, sigma, sigma_data=1.0):
    """(c_skip, c_out, c_in): k-diffusion DiscreteEpsDDPMDenoiser / DiscreteVDDPMDenoiser."""
    c_in = 1 / (sigma ** 2 + sigma_data ** 2) ** 0.5
    if prediction == "eps":
        return 1.0, -sigma, c_in
    if prediction == "v":
        c_skip = sigma_data ** 2 / (sigma ** 2 + sigma_data ** 2)
        c_out = -sigma * sigma_data / (sigma ** 2 + sigma_data ** 2) ** 0.5
        return c_skip, c_out, c_in
    raise ValueError(prediction)


# ---------------------------------------------------------------------------------------------------------------------
# Schedulers: n steps -> n + 1 sigmas ending in 0 (float64 lists)

AYS_SD1 = [14.6146412293, 6.4745760956, 3.8636745985, 2.6946151520, 1.8841921177, 1.3943805092,
           0.9642583904, 0.6523686016, 0.3977456272, 0.1515232662, 0.0291671582]


def loglinear_interp(t_steps, num_steps):
    """NVIDIA's Align Your Steps howto: interpolate log sigma linearly on [0, 1]."""
    xs = np.linspace(0, 1, len(t_steps))
    ys = np.log(np.asarray(t_steps)[::-1])
    new_xs = np.linspace(0, 1, num_steps)
    new_ys = np.interp(new_xs, xs, ys)
    return np.exp(new_ys)[::-1].copy()


def get_sigmas(name, n, schedule):
    t_max = len(schedule.sigmas) - 1
    if name == "discrete":  # k-diffusion DiscreteSchedule.get_sigmas(n)
        sig = [schedule.t_to_sigma(float(t)) for t in np.linspace(t_max, 0, n)]
    elif name == "karras":  # k-diffusion get_sigmas_karras, rho = 7
        rho = 7.0
        min_inv_rho = schedule.sigma_min ** (1 / rho)
        max_inv_rho = schedule.sigma_max ** (1 / rho)
        sig = [(max_inv_rho + r * (min_inv_rho - max_inv_rho)) ** rho for r in np.linspace(0, 1, n)]
    elif name == "exponential":  # k-diffusion get_sigmas_exponential
        sig = [math.exp(v) for v in np.linspace(math.log(schedule.sigma_max), math.log(schedule.sigma_min), n)]
    elif name == "ays":  # ComfyUI AlignYourStepsScheduler, SD1
        levels = list(AYS_SD1)
        if n + 1 != len(levels):
            levels = list(loglinear_interp(levels, n + 1))
        sig = levels[:-1]
    elif name == "sgm_uniform":  # ComfyUI normal_scheduler(sgm=True)
        sig = [schedule.t_to_sigma(float(t)) for t in np.linspace(t_max, 0, n + 1)[:-1]]
    elif name == "simple":  # ComfyUI simple_scheduler
        ss = len(schedule.sigmas) / n
        sig = [float(schedule.sigmas[-(1 + int(x * ss))]) for x in range(n)]
    else:
        raise ValueError(name)
    return [float(s) for s in sig] + [0.0]


SCHEDULERS = ["discrete", "karras", "exponential", "ays", "sgm_uniform", "simple"]

# ---------------------------------------------------------------------------------------------------------------------
# The toy denoiser the C++ tests reimplement: smooth, nonlinear, and different at every sigma.

TOY_SIGMA_DATA2 = 0.25
TOY_TANH_WEIGHT = 0.1


def toy_denoiser(x, sigma):
    """D(x, sigma) = x * 0.25 / (0.25 + sigma^2) + 0.1 * tanh(x)."""
    return x * (TOY_SIGMA_DATA2 / (TOY_SIGMA_DATA2 + sigma * sigma)) + TOY_TANH_WEIGHT * torch.tanh(x)


# ---------------------------------------------------------------------------------------------------------------------
# Samplers (k-diffusion conventions: x = x0 + sigma * noise, model returns x0)


def to_d(x, sigma, denoised):
    return (x - denoised) / sigma


def get_ancestral_step(sigma_from, sigma_to, eta=1.0):
    if not eta:
        return sigma_to, 0.0
    sigma_up = min(sigma_to, eta * (sigma_to ** 2 * (sigma_from ** 2 - sigma_to ** 2) / sigma_from ** 2) ** 0.5)
    sigma_down = (sigma_to ** 2 - sigma_up ** 2) ** 0.5
    return sigma_down, sigma_up


def sample_euler(model, x, sigmas, **_):
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i])
        x = x + to_d(x, sigmas[i], denoised) * (sigmas[i + 1] - sigmas[i])
    return x


def sample_euler_ancestral(model, x, sigmas, eta=1.0, noise=None, **_):
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i])
        sigma_down, sigma_up = get_ancestral_step(sigmas[i], sigmas[i + 1], eta=eta)
        x = x + to_d(x, sigmas[i], denoised) * (sigma_down - sigmas[i])
        if sigmas[i + 1] > 0:
            x = x + noise() * sigma_up
    return x


def sample_heun(model, x, sigmas, **_):
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i])
        d = to_d(x, sigmas[i], denoised)
        dt = sigmas[i + 1] - sigmas[i]
        if sigmas[i + 1] == 0:
            x = x + d * dt
        else:
            x_2 = x + d * dt
            d_2 = to_d(x_2, sigmas[i + 1], model(x_2, sigmas[i + 1]))
            x = x + (d + d_2) / 2 * dt
    return x


def sample_dpm_2(model, x, sigmas, **_):
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i])
        d = to_d(x, sigmas[i], denoised)
        if sigmas[i + 1] == 0:
            x = x + d * (sigmas[i + 1] - sigmas[i])
        else:
            sigma_mid = math.exp((math.log(sigmas[i]) + math.log(sigmas[i + 1])) / 2)
            x_2 = x + d * (sigma_mid - sigmas[i])
            d_2 = to_d(x_2, sigma_mid, model(x_2, sigma_mid))
            x = x + d_2 * (sigmas[i + 1] - sigmas[i])
    return x


def _t_fn(sigma):
    return -math.log(sigma)


def _sigma_fn(t):
    return math.exp(-t)


def sample_dpmpp_2s_ancestral(model, x, sigmas, eta=1.0, noise=None, **_):
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i])
        sigma_down, sigma_up = get_ancestral_step(sigmas[i], sigmas[i + 1], eta=eta)
        if sigma_down == 0:
            x = x + to_d(x, sigmas[i], denoised) * (sigma_down - sigmas[i])
        else:
            t, t_next = _t_fn(sigmas[i]), _t_fn(sigma_down)
            r = 1 / 2
            h = t_next - t
            s = t + r * h
            x_2 = (_sigma_fn(s) / _sigma_fn(t)) * x - math.expm1(-h * r) * denoised
            denoised_2 = model(x_2, _sigma_fn(s))
            x = (_sigma_fn(t_next) / _sigma_fn(t)) * x - math.expm1(-h) * denoised_2
        if sigmas[i + 1] > 0:
            x = x + noise() * sigma_up
    return x


def _sample_dpmpp_2m(model, x, sigmas, v2):
    old_denoised = None
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i])
        if sigmas[i + 1] == 0:
            x = denoised  # sigma_fn(inf) / sigma_fn(t) = 0, expm1(-inf) = -1
        else:
            t, t_next = _t_fn(sigmas[i]), _t_fn(sigmas[i + 1])
            h = t_next - t
            if old_denoised is None:
                x = (_sigma_fn(t_next) / _sigma_fn(t)) * x - math.expm1(-h) * denoised
            else:
                h_last = t - _t_fn(sigmas[i - 1])
                if v2:
                    h_min, h_max = min(h_last, h), max(h_last, h)
                    r = h_max / h_min
                    h_d = (h_max + h_min) / 2
                else:
                    r = h_last / h
                    h_d = h
                denoised_d = (1 + 1 / (2 * r)) * denoised - (1 / (2 * r)) * old_denoised
                x = (_sigma_fn(t_next) / _sigma_fn(t)) * x - math.expm1(-h_d) * denoised_d
        old_denoised = denoised
    return x


def sample_dpmpp_2m(model, x, sigmas, **_):
    return _sample_dpmpp_2m(model, x, sigmas, v2=False)


def sample_dpmpp_2m_v2(model, x, sigmas, **_):
    return _sample_dpmpp_2m(model, x, sigmas, v2=True)


def sample_ipndm(model, x, sigmas, max_order=4, **_):
    buffer_model = []
    for i in range(len(sigmas) - 1):
        t_cur, t_next = sigmas[i], sigmas[i + 1]
        d_cur = (x - model(x, t_cur)) / t_cur
        order = min(max_order, i + 1)
        if order == 1:
            x = x + (t_next - t_cur) * d_cur
        elif order == 2:
            x = x + (t_next - t_cur) * (3 * d_cur - buffer_model[-1]) / 2
        elif order == 3:
            x = x + (t_next - t_cur) * (23 * d_cur - 16 * buffer_model[-1] + 5 * buffer_model[-2]) / 12
        else:
            x = x + (t_next - t_cur) * (55 * d_cur - 59 * buffer_model[-1] + 37 * buffer_model[-2]
                                        - 9 * buffer_model[-3]) / 24
        if len(buffer_model) == max_order - 1:
            buffer_model = buffer_model[1:]
        buffer_model.append(d_cur)
    return x


def sample_lcm(model, x, sigmas, noise=None, **_):
    for i in range(len(sigmas) - 1):
        x = model(x, sigmas[i])
        if sigmas[i + 1] > 0:
            x = x + sigmas[i + 1] * noise()  # eps noise_scaling
    return x


def _vp_eps_model(model, alphas_cumprod):
    """Wraps the k-diffusion denoiser as a diffusers eps-prediction UNet on x_t (variance preserving)."""
    ac = alphas_cumprod.double()

    def sigma_of(t):
        return float(((1 - ac[t]) / ac[t]).sqrt())

    def eps(sample, t):
        s = sigma_of(t)
        x_k = sample * math.sqrt(1 + s * s)
        return (x_k - model(x_k, s)) / s

    return ac, sigma_of, eps


def sample_ddim_trailing(model, x, sigmas, eta=0.0, noise=None, alphas_cumprod=None, **_):
    """diffusers DDIMScheduler.step, timestep_spacing="trailing", set_alpha_to_one=False, epsilon prediction."""
    ac, sigma_of, eps_model = _vp_eps_model(model, alphas_cumprod)
    T = len(ac)
    steps = len(sigmas) - 1
    step_ratio = T / steps
    timesteps = (np.round(np.arange(T, 0, -step_ratio)).astype(np.int64) - 1)[:steps]
    sample = x / sigma_of(int(timesteps[0]))  # x = noise * sigma -> x_T = noise (sd.cpp's initial scaling)
    for t in timesteps:
        t = int(t)
        model_output = eps_model(sample, t)
        prev_t = t - T // steps
        a_t = ac[t]
        a_prev = ac[prev_t] if prev_t >= 0 else ac[0]
        b_t = 1 - a_t
        pred_original_sample = (sample - b_t.sqrt() * model_output) / a_t.sqrt()
        variance = ((1 - a_prev) / b_t) * (1 - a_t / a_prev)
        std_dev_t = eta * variance.sqrt()
        pred_sample_direction = (1 - a_prev - std_dev_t ** 2).sqrt() * model_output
        sample = a_prev.sqrt() * pred_original_sample + pred_sample_direction
        if eta > 0:
            sample = sample + std_dev_t * noise()
    return sample


def sample_tcd(model, x, sigmas, eta=0.0, noise=None, alphas_cumprod=None, original_steps=50, **_):
    """diffusers TCDScheduler.step (gamma = eta), epsilon prediction."""
    ac, sigma_of, eps_model = _vp_eps_model(model, alphas_cumprod)
    T = len(ac)
    steps = len(sigmas) - 1
    k = T // original_steps
    origin = (np.arange(1, original_steps + 1) * k - 1)[::-1]
    timesteps = origin[np.floor(np.linspace(0, original_steps, num=steps, endpoint=False)).astype(np.int64)]
    sample = x / sigma_of(int(timesteps[0]))
    for i, t in enumerate(timesteps):
        t = int(t)
        prev_t = int(timesteps[i + 1]) if i + 1 < steps else 0
        t_s = int(torch.floor((1 - eta) * torch.tensor(prev_t)).long())  # float32 product, as diffusers
        model_output = eps_model(sample, t)
        a_t, a_prev, a_s = ac[t], ac[prev_t], ac[t_s]
        pred_original_sample = (sample - (1 - a_t).sqrt() * model_output) / a_t.sqrt()
        pred_noised_sample = a_s.sqrt() * pred_original_sample + (1 - a_s).sqrt() * model_output
        if eta > 0 and i != steps - 1:
            sample = (a_prev / a_s).sqrt() * pred_noised_sample + (1 - a_prev / a_s).sqrt() * noise()
        else:
            sample = pred_noised_sample
    return sample


SAMPLERS = {
    "euler": sample_euler,
    "euler_a": sample_euler_ancestral,
    "heun": sample_heun,
    "dpm2": sample_dpm_2,
    "dpm++2s_a": sample_dpmpp_2s_ancestral,
    "dpm++2m": sample_dpmpp_2m,
    "dpm++2mv2": sample_dpmpp_2m_v2,
    "ipndm": sample_ipndm,
    "lcm": sample_lcm,
    "ddim_trailing": sample_ddim_trailing,
    "tcd": sample_tcd,
}


# ---------------------------------------------------------------------------------------------------------------------
# Rectified flow (Flux): x = (1 - sigma) x0 + sigma * noise; the network predicts v = noise - x0.


def bfl_time_shift(mu, sigma, t):
    """BFL flux/sampling.py time_shift."""
    return math.exp(mu) / (math.exp(mu) + (1 / t - 1) ** sigma)


def bfl_lin_function(x1=256, y1=0.5, x2=4096, y2=1.15):
    """BFL flux/sampling.py get_lin_function."""
    m = (y2 - y1) / (x2 - x1)
    b = y1 - m * x1
    return lambda x: m * x + b


def bfl_get_schedule(num_steps, image_seq_len, base_shift=0.5, max_shift=1.15, shift=True):
    """BFL flux/sampling.py get_schedule: linspace(1, 0, n + 1), time-shifted with a resolution-dependent mu."""
    timesteps = torch.linspace(1, 0, num_steps + 1, dtype=torch.float64)
    if shift:
        mu = bfl_lin_function(y1=base_shift, y2=max_shift)(image_seq_len)
        timesteps = [bfl_time_shift(mu, 1.0, float(t)) if t > 0 else 0.0 for t in timesteps]
    return [float(t) for t in timesteps]


def bfl_denoise(model_velocity, x, timesteps):
    """BFL flux/sampling.py denoise: img = img + (t_prev - t_curr) * pred (Euler on the velocity)."""
    for t_curr, t_prev in zip(timesteps[:-1], timesteps[1:]):
        pred = model_velocity(x, t_curr)
        x = x + (t_prev - t_curr) * pred
    return x


def sample_euler_ancestral_rf(model, x, sigmas, eta=1.0, noise=None, **_):
    """ComfyUI k_diffusion sample_euler_ancestral_RF (s_noise 1)."""
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i])
        if sigmas[i + 1] == 0:
            x = denoised
            continue
        downstep_ratio = 1 + (sigmas[i + 1] / sigmas[i] - 1) * eta
        sigma_down = sigmas[i + 1] * downstep_ratio
        alpha_ip1 = 1 - sigmas[i + 1]
        alpha_down = 1 - sigma_down
        renoise_coeff = (sigmas[i + 1] ** 2 - sigma_down ** 2 * alpha_ip1 ** 2 / alpha_down ** 2) ** 0.5
        sigma_down_i_ratio = sigma_down / sigmas[i]
        x = sigma_down_i_ratio * x + (1 - sigma_down_i_ratio) * denoised
        x = (alpha_ip1 / alpha_down) * x + noise() * renoise_coeff
    return x


def sample_lcm_flow(model, x, sigmas, noise=None, **_):
    """ComfyUI sample_lcm with CONST noise_scaling: sigma * noise + (1 - sigma) * x0."""
    for i in range(len(sigmas) - 1):
        x = model(x, sigmas[i])
        if sigmas[i + 1] > 0:
            x = sigmas[i + 1] * noise() + (1 - sigmas[i + 1]) * x
    return x
