"""The vLLM plugin's entry point, `register`, which imports no vLLM at its top, so it always loads (docs/design.md)."""
from __future__ import annotations

import functools
import logging
import os

from specdecpp.serving.vllm import SECTION, cached_prices, check_config, priced_settings

logger = logging.getLogger(__name__)
hook_failure: str | None = None  # why the proposer could not be hooked in this process (None: it is, or not yet)


def register() -> None:
    """Check each engine config as it is made and make the `draft_model` proposer of one with a `specdecpp` section
    a `SpecDecPPDraftProposer`. Idempotent; never raises: the engines that ask for the head raise a failed hook."""
    global hook_failure
    try:
        from vllm.engine.arg_utils import EngineArgs
    except Exception as error:  # nothing left to refuse a section with: say so where vLLM logs its plugins
        logger.error("specdecpp's vLLM plugin cannot check engine configs (%s: %s): an additional_config['specdecpp'] "
                     "section would not be served", type(error).__name__, error)
        return
    if getattr(EngineArgs.create_engine_config, "specdecpp", False):
        return
    create_engine_config = EngineArgs.create_engine_config

    def checked_create_engine_config(self, *args, **kwargs):
        vllm_config = create_engine_config(self, *args, **kwargs)
        settings = check_config(vllm_config, hook_failure)
        if settings is not None:
            from specdecpp.serving.vllm_timing import TIMING_ENV, ensure_prices

            if not os.environ.get(TIMING_ENV):  # an engine that times the steps needs no prices
                ensure_prices(vllm_config, vllm_config.additional_config[SECTION]["head"], settings.head)
        return vllm_config

    checked_create_engine_config.specdecpp = True
    EngineArgs.create_engine_config = checked_create_engine_config
    hook_failure = hook_proposer()


def hook_proposer() -> str | None:
    """Wrap `DraftModelProposer.__init__` so that a proposer built for a config with a `specdecpp` section becomes a
    `SpecDecPPDraftProposer`; the reason it cannot (an import fails, a method it wraps is gone), or None."""
    try:
        from specdecpp.serving.vllm_draft import DraftModelProposer, SpecDecPPDraftProposer
    except Exception as error:
        return f"importing its proposer failed ({type(error).__name__}: {error})"
    if missing := [name for name in SpecDecPPDraftProposer.WRAPS if not hasattr(DraftModelProposer, name)]:
        return f"DraftModelProposer has no {', '.join(missing)}"
    init = DraftModelProposer.__init__

    @functools.wraps(init)  # __wrapped__: the source check reads vLLM's own
    def plugged_init(self, vllm_config, *args, **kwargs):
        init(self, vllm_config, *args, **kwargs)
        settings = check_config(vllm_config)
        if settings is not None:
            prices = cached_prices(vllm_config, settings.head)
            runner = kwargs.get("runner", args[1] if len(args) > 1 else None)  # after `device`
            SpecDecPPDraftProposer.plug(self, priced_settings(settings, prices), prices, runner)

    DraftModelProposer.__init__ = plugged_init
    return None
