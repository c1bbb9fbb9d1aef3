"""The doctor's measurements: each part of the input pipeline timed on a sample of real data.

- :mod:`~stoker.doctor.measure.timing`: :class:`Stage` (one measured stage) and the timing loop;
- :mod:`~stoker.doctor.measure.source`: opening SOURCE and picking the sample;
- :mod:`~stoker.doctor.measure.storage`: reads, cold and warm, from files, a packed file or
  records;
- :mod:`~stoker.doctor.measure.decode`: the decoders, at full and at reduced size;
- :mod:`~stoker.doctor.measure.augment`: the transforms (op by op) and the write into a batch
  slot;
- :mod:`~stoker.doctor.measure.loader`: ``stoker.Loader`` run at a given worker count;
- :mod:`~stoker.doctor.measure.device`: the host-to-device copy and the model step (torch).

Each measurement runs one part for about ``seconds`` and returns its figures; none of them
decides anything (the stages in :mod:`stoker.doctor.stages` do).
"""
