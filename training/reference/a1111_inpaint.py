"""Inpainting with a plain (4-channel) UNet the way AUTOMATIC1111's webui does it: the masking logic
only, transcribed from AUTOMATIC1111/stable-diffusion-webui

  modules/processing.py         create_binary_mask, apply_overlay,
                                StableDiffusionProcessingImg2Img.init (image_mask -> mask_for_overlay,
                                latent_mask -> self.mask / self.nmask, init_latent) and .sample (the
                                blend after sampling)
  modules/sd_samplers_cfg_denoiser.py  CFGDenoiser.forward: combine_denoised and apply_blend, the blend
                                after every model evaluation (mask_before_denoising is False)
  modules/sd_samplers_common.py setup_img2img_steps; sd_samplers_kdiffusion.py sample_img2img
                                (sigma_sched = sigmas[steps - t_enc - 1:], xi = x + noise * sigma_sched[0])
  ldm/modules/distributions/distributions.py  DiagonalGaussianDistribution.sample (the init latent is a
                                sample: get_first_stage_encoding of encode_first_stage)

The networks (CLIP, UNet, VAE) and the sampler itself are not here: the caller brings them.

Conventions (A1111's): the mask image is white where the image is repainted. self.nmask is 1 where the
latent is repainted, self.mask = 1 - nmask where the init latent is kept; after each denoiser call
denoised = denoised * nmask + init_latent * mask, and once more on the sampler's result.

The parameters this reference supports are those a plain-model inpainting job with kiln's rule has:
mask_blur 0 (A1111's default is 4: a Gaussian blur of the mask before everything else),
inpainting_fill 1 ("original": the init image is encoded as it is; A1111's dataclass default is 0,
"fill"), inpaint_full_res False ("whole picture"), inpainting_mask_invert 0, resize_mode 0 at the
image's own size (no resize), no latent_mask override, opts.img2img_fix_steps False.
"""

import numpy as np
import torch
from PIL import Image, ImageOps

# ---------------------------------------------------------------------------------------------------------------
# modules/processing.py


def create_binary_mask(image):
    if image.mode == "RGBA" and image.getextrema()[-1] != (255, 255):
        image = image.split()[-1].convert("L").point(lambda x: 255 if x > 128 else 0)
    else:
        image = image.convert("L")
    return image


def apply_overlay(image, paste_loc, index, overlays):
    if overlays is None or index >= len(overlays):
        return image
    overlay = overlays[index]
    assert paste_loc is None  # inpaint_full_res only
    image = image.convert("RGBA")
    image.alpha_composite(overlay)
    image = image.convert("RGB")
    return image


class Img2ImgMasking:
    """The mask-related state StableDiffusionProcessingImg2Img.init leaves: mask_for_overlay,
    overlay_images, and (after set_init_latent) init_latent, mask and nmask."""

    def __init__(self, mask, width, height, mask_blur=0, inpainting_fill=1, inpaint_full_res=False,
                 inpainting_mask_invert=0, resize_mode=0):
        assert mask_blur == 0 and inpainting_fill == 1 and not inpaint_full_res and resize_mode == 0
        self.width, self.height = width, height
        self.inpainting_fill = inpainting_fill
        image_mask = mask
        # image_mask is passed in as RGBA by Gradio to support alpha masks,
        # but we still want to support binary masks.
        image_mask = create_binary_mask(image_mask)
        if inpainting_mask_invert:
            image_mask = ImageOps.invert(image_mask)
        # (mask_blur_x / mask_blur_y > 0: cv2.GaussianBlur; not with kiln's rule)
        # not inpaint_full_res:
        image_mask = resize_image_mode0(image_mask, self.width, self.height)
        np_mask = np.array(image_mask)
        np_mask = np.clip((np_mask.astype(np.float32)) * 2, 0, 255).astype(np.uint8)
        self.mask_for_overlay = Image.fromarray(np_mask)
        self.overlay_images = []
        self.image_mask = image_mask
        self.latent_mask = image_mask  # self.latent_mask is None: latent_mask = image_mask
        self.init_latent = None
        self.mask = None
        self.nmask = None

    def prepare_image(self, img):
        """The init image as the VAE encodes it: [3, H, W] float32 in [0, 1] (images_tensor_to_samples
        then maps it to [-1, 1]); records the overlay image."""
        image = img.convert("RGB")  # images.flatten of an RGB image
        image = resize_image_mode0(image, self.width, self.height)
        image_masked = Image.new("RGBa", (image.width, image.height))
        image_masked.paste(image.convert("RGBA").convert("RGBa"), mask=ImageOps.invert(self.mask_for_overlay.convert("L")))
        self.overlay_images.append(image_masked.convert("RGBA"))
        # inpainting_fill == 1 ("original"): masking.fill is not applied
        image = np.array(image).astype(np.float32) / 255.0
        image = np.moveaxis(image, 2, 0)
        return image

    def set_init_latent(self, init_latent):
        """init_latent: [1, C, h, w] (scaled VAE sample). Makes self.mask / self.nmask."""
        self.init_latent = init_latent
        channels = init_latent.shape[1]
        init_mask = self.latent_mask
        latmask = init_mask.convert("RGB").resize((self.init_latent.shape[3], self.init_latent.shape[2]))
        latmask = np.moveaxis(np.array(latmask, dtype=np.float32), 2, 0) / 255
        latmask = latmask[0]
        latmask = np.around(latmask)
        latmask = np.tile(latmask[None], (channels, 1, 1))
        self.mask = torch.asarray(1.0 - latmask).to(init_latent.dtype)
        self.nmask = torch.asarray(latmask).to(init_latent.dtype)
        # inpainting_fill 2 (latent noise) and 3 (latent nothing) would change init_latent here

    def sample_final_blend(self, samples):
        """StableDiffusionProcessingImg2Img.sample, after sample_img2img."""
        if self.mask is not None:
            samples = samples * self.nmask + self.init_latent * self.mask
        return samples


def resize_image_mode0(im, width, height):
    """images.resize_image(0, ...) with no upscaler: a LANCZOS resize (a copy at the same size)."""
    return im.resize((width, height), resample=Image.LANCZOS)


# ---------------------------------------------------------------------------------------------------------------
# modules/sd_samplers_cfg_denoiser.py


class CFGDenoiserBlend:
    """CFGDenoiser.forward's combine and blend for one prompt and one negative prompt (no AND, no edit
    model, no skipped uncond): denoised = uncond + (cond - uncond) * cond_scale, then apply_blend."""

    def __init__(self, masking, cond_scale):
        self.mask = masking.mask
        self.nmask = masking.nmask
        self.init_latent = masking.init_latent
        self.cond_scale = cond_scale
        self.mask_before_denoising = False

    def combine_denoised(self, x_out, cond_index=0):
        denoised_uncond = x_out[-1:]
        denoised = torch.clone(denoised_uncond)
        denoised[0] += (x_out[cond_index] - denoised_uncond[0]) * (1.0 * self.cond_scale)
        return denoised

    def apply_blend(self, current_latent):
        return current_latent * self.nmask + self.init_latent * self.mask

    def __call__(self, inner_model, x, sigma):
        """inner_model(x_in [2, ...], sigma) -> denoised for (cond, uncond) in that order."""
        if self.mask_before_denoising and self.mask is not None:
            x = self.apply_blend(x)
        x_in = torch.cat([x, x])
        x_out = inner_model(x_in, sigma)
        denoised = self.combine_denoised(x_out)
        if not self.mask_before_denoising and self.mask is not None:
            denoised = self.apply_blend(denoised)
        return denoised


# ---------------------------------------------------------------------------------------------------------------
# modules/sd_samplers_common.py, sd_samplers_kdiffusion.py


def setup_img2img_steps(steps, denoising_strength, img2img_fix_steps=False):
    if img2img_fix_steps:
        requested_steps = steps
        steps = int(requested_steps / min(denoising_strength, 0.999)) if denoising_strength > 0 else 0
        t_enc = requested_steps - 1
    else:
        t_enc = int(min(denoising_strength, 0.999) * steps)
    return steps, t_enc


def img2img_sigma_sched(sigmas, steps, t_enc):
    """sample_img2img: the schedule's tail the sampler runs."""
    return sigmas[steps - t_enc - 1:]


def img2img_start(init_latent, noise, sigma_sched):
    """sample_img2img: xi = x + noise * sigma_sched[0] (no extra noise)."""
    return init_latent + noise * sigma_sched[0]


# ---------------------------------------------------------------------------------------------------------------
# ldm DiagonalGaussianDistribution


def diagonal_gaussian_sample(parameters, noise):
    """mean, logvar = chunk(parameters, 2, dim=1); logvar clamped to [-30, 20]; mean + std * noise."""
    mean, logvar = torch.chunk(parameters, 2, dim=1)
    logvar = torch.clamp(logvar, -30.0, 20.0)
    std = torch.exp(0.5 * logvar)
    return mean + std * noise


# ---------------------------------------------------------------------------------------------------------------
# For comparison: kiln's (and sd-cli's) latent mask, src/pipeline/generate.cpp latent_mask_plane.


def kiln_latent_mask(mask_l, latent_w, latent_h):
    """Pixel mask (uint8 [H, W]) rounded at 0.5 (v / 255 >= 0.5), then the max of each block a latent
    pixel covers. Returns float [latent_h, latent_w], 1 = repaint."""
    h, w = mask_l.shape
    on = (mask_l.astype(np.float32) / 255.0) >= 0.5
    out = np.zeros((latent_h, latent_w), dtype=np.float32)
    down = w // latent_w
    for y in range(h):
        for x in range(w):
            if on[y, x]:
                out[min(y // down, latent_h - 1), min(x // down, latent_w - 1)] = 1.0
    return out
