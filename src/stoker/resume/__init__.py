"""Resume a user can prove: :func:`check_resume` runs a loader configuration in child
processes, SIGKILLs them at random steps, resumes each from its last saved ``state_dict()``
(on the same number of ranks, or on another) and checks that the samples delivered across
the kills are exactly an uninterrupted run's, pixels and fields included. ``stoker
check-resume`` is its command; ``docs/resume.md`` tells what it checks and what it costs."""

from stoker.resume._compare import Difference
from stoker.resume.check import ResumeReport, check_resume
from stoker.resume.spec import LoaderSpec

__all__ = ["Difference", "LoaderSpec", "ResumeReport", "check_resume"]
