"""The doctor's stages, in the order a run takes them; each fills one part of
:class:`~stoker.doctor.findings.Findings`.

1. :mod:`~stoker.doctor.stages.storage`: read the sample cold and warm (a folder also from
   one packed file) and pick the figure to plan with;
2. :mod:`~stoker.doctor.stages.decode`: decode the sample with each decoder and with the
   loader's own decode step;
3. :mod:`~stoker.doctor.stages.augment`: apply the transforms (a ``Compose`` op by op);
4. :mod:`~stoker.doctor.stages.alternatives`: decode at the output size, and payloads
   resized at pack time;
5. :mod:`~stoker.doctor.stages.cost`: the batch-slot write, and one worker's per-sample cost;
6. :mod:`~stoker.doctor.stages.loader`: the loader at 1..N workers, its efficiency and the
   predictions;
7. :mod:`~stoker.doctor.stages.device`: the host-to-device copy and the model step;
8. :mod:`~stoker.doctor.stages.system`: the system checks;
9. :mod:`~stoker.doctor.stages.verdict`: the stage that bounds the run and the ranked
   changes.

A stage that cannot run here records why (``Findings.skip``) and leaves its part empty; the
rest of the run goes on.
"""
