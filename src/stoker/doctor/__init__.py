"""The doctor: why does the GPU wait, with numbers, and what to change.

- :func:`watch` wraps a training loop's data source and measures, per step, the time spent
  waiting for data; a watchdog prints every thread's stack when a batch does not come.
- :func:`diagnose` (``stoker doctor SOURCE``) measures each stage of the input pipeline on this
  machine (storage, decode, augmentation, the loader at 1..N workers, the copy to the GPU, the
  model) and returns a :class:`Report` naming the stage that bounds the run, the expected GPU
  busy share and the changes ranked by their gain.
- :func:`require_matplotlib` raises ``ImportError`` naming the install when the chart
  (``Report.plot``, ``Report.figure``) cannot be drawn; ``stoker doctor --plot`` calls it before
  measuring anything.
"""

from __future__ import annotations

from stoker.doctor.chart import require_matplotlib
from stoker.doctor.diagnose import diagnose
from stoker.doctor.report import Report
from stoker.doctor.watch import Watched, WatchStats, watch

__all__ = ["Report", "WatchStats", "Watched", "diagnose", "require_matplotlib", "watch"]
