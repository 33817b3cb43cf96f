"""`eval.py`'s batch size on a GPU profile: the inference plan's, never a training plan's.

Evaluation runs `Trainer.validate` on its own: eval mode under `torch.inference_mode`, the
parameters resident and nothing of training. `hw.val_batch_size: auto` takes the largest batch
the planner's inference phase fits into the profile's budget; a size the user set is kept, and
refused before any work when that phase says it does not fit.
"""

from __future__ import annotations

from omegaconf import DictConfig

from vramkit.core.hardware.profile import HardwareProfile, ProfileSource
from vramkit.core.units import GIB


def settle_eval_batch(
    cfg: DictConfig,
    profile: HardwareProfile,
    source: ProfileSource,
) -> tuple[HardwareProfile, tuple[str, ...]]:
    """`profile` with `val_batch_size` planned for inference when it is "auto" on a GPU profile,
    and the line that says so (batch, planned peak, budget).

    A CPU profile (a CPU host, or a GPU profile mapped onto one) is returned as it is, with no
    line: its "auto" takes the task's stated default later, as before. Raises `DoesNotFitError`
    when a set `hw.val_batch_size` does not fit (naming the key, its file and the largest that
    fits) or when not even one sample fits.
    """
    if profile.accelerator != "gpu" or profile.budget_gib is None:
        return profile, ()
    # Imported here: the planner pulls in Lightning and fake tensors, which CPU runs never need.
    from vramkit.core.planner import DoesNotFitError, PlanningError
    from vramkit.core.planner.decisions.inference_plan import plan_inference_batch_size
    from vramkit.core.planner.request import batch_size_request
    from vramkit.core.run.settling.plan_request_from_config import plan_request

    val = batch_size_request(profile).val
    searched = val is None
    try:  # evaluation plans no training batch: 1
        plan = plan_inference_batch_size(plan_request(cfg, profile, batch_sizes=(1, val)))
    except PlanningError as error:
        fallback = "'auto' takes the task's stated default" if searched else "it is not checked"
        return profile, (f"memory planner unavailable ({error}); the eval batch size {fallback}",)
    if not plan.fits:
        budget = f"{profile.label}'s budget of {plan.budget_bytes / GIB:.2f} GiB for evaluation"
        peak = f"planned peak {plan.inference.peak_gib:.2f} GiB"
        if searched:
            raise DoesNotFitError(
                f"hw.val_batch_size=auto: not even batch size 1 fits {budget} ({peak}); run "
                f"scripts/plan_memory.py +hw={profile.name} to see the inference phase"
            )
        largest = (
            f"the largest that fits is {plan.largest}: set hw.val_batch_size={plan.largest}"
            if plan.largest
            else "not even batch size 1 fits"
        )
        raise DoesNotFitError(
            f"hw.val_batch_size={profile.val_batch_size} ({source.where('val_batch_size')}) "
            f"does not fit {budget} ({peak}); {largest}"
        )
    if not searched:  # the user's size stands (a loader caps it at the set's size itself)
        return profile, (plan.line(),)
    return profile.model_copy(update={"val_batch_size": plan.inference.batch_size}), (plan.line(),)
