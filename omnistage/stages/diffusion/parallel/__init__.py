"""One diffusion replica over several devices (``parallel_config: {cfg_parallel_size, ulysses_degree}``).

The replica is a group of processes under ``torch.distributed`` (NCCL between GPUs, gloo on CPU), one
per device, started and watched together by ``omnistage.transport.process_group.ProcessGroupStageEngine``
(the mp transport's process engine: a rank dying fails the replica's requests and the group restarts,
remote.py's policy).

- Rank 0 is the ordinary diffusion engine (engine.py): it owns the scheduler and the step loop. Before
  each step it sends the other ranks a small typed ``StepPlan`` (steps.py): which requests the forward
  holds, the newly admitted ones (pickled once, before any tensor work) and the ones to forget. Every
  rank then runs the same step on its own copies of the requests, in lock-step; only rank 0 decodes.
- CFG parallel (rows.py): the uncond rows of CFG requests run on one half of the group, their cond rows
  on the other, rows without CFG are split evenly; the predictions are all-gathered and every rank
  applies the per-request guidance (``runner.guide``) to the same full set of rows.
- Ulysses sequence parallel (ulysses.py): inside the denoiser each rank keeps 1/N of the tokens and
  all-to-alls exchange heads around attention. diffusers' own context-parallel hooks and attention
  dispatch do the work; omnistage adds plans for the models diffusers ships none for.
"""
