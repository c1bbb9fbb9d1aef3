"""A ``keras.utils.PyDataset`` over a stoker loader.

NOTE [ Keras adapter: who does the work, who owns each buffer, shutdown ]

Processes. Keras sees a single-worker dataset (``workers=1``, ``use_multiprocessing=False``,
``max_queue_size=1``; the properties are read-only), so Keras never starts a thread pool or
forks: the parallel work happens in the loader's worker processes, which write batches into
shared-memory slots. Keras calls ``__getitem__`` from the thread that runs ``fit`` (under
TensorFlow from ``tf.data`` threads: see Threads).

Order. Keras asks for batch *indices*, shuffled when ``fit(shuffle=True)`` (its default). A
loader is a stream that already shuffles (by ``seed`` and epoch), so the index is checked for
range and otherwise ignored: request k of a Keras epoch gets the loader's next batch. Every
batch of a loader epoch is delivered exactly once per pass.

Epochs. ``len(ds)`` is ``len(loader)`` or ``steps``. With ``steps`` the batches flow on across
loader epochs (a pass that ends mid Keras-epoch wraps into the next loader epoch; a Keras
epoch that ends mid-pass leaves the rest of the pass for the next Keras epoch). The loader
advances its own epoch once the last batch of a pass has been handed out (``loader.epoch``
says so at ``on_epoch_end``); the next pass starts on the next request. Keras builds an
unbuilt model by pulling one batch and then ending the "epoch" (``_symbolic_build``, then
``reset``): that batch is kept (an owned copy) and served again as the first batch of the
real first epoch, so Keras epoch k is exactly loader epoch k. One dataset per loader at a
time: a loader has one live iteration.

Look-ahead. A request made outside an epoch (before the first ``on_epoch_begin``, after an
``on_epoch_end``) is a look-ahead: ``ds[i]`` is the i-th batch the next epoch will serve,
kept (an owned copy) until that epoch serves it; asking again gives the same batch. The
TensorFlow backend relies on it: to build the ``tf.data`` signature it pulls ``ds[0]`` and
``ds[1]`` before ``fit``/``evaluate``/``predict`` start their epoch, and then expects those
batches again in the epoch. Were they consumed, the epoch would start two batches late and
``predict``'s rows would no longer line up with the samples.

Threads. Under TensorFlow, ``__getitem__`` runs in ``tf.data`` threads (one at a time, a
batch or two ahead of the model), not in the thread that runs ``fit``; when ``fit`` stops
early, such a thread may still be waiting for a batch. A lock serialises ``__getitem__``,
the epoch hooks and ``close()``, so ``close()`` waits for that request to finish before it
ends the pass (a request after it gets "closed", never a half-closed loader). The batches
``tf.data`` had pulled ahead when ``fit`` stopped are not replayed.

Buffers. A batch's images are a view of a shared-memory slot that the loader reuses when the
next batch is requested. The torch backend copies every NumPy batch into its own tensor
(``np.array`` in ``convert_to_tensor``) before the next request, so with it the view is
handed over as it is; with other backends (jax, tensorflow, numpy) the images are copied
once here. Converting to a float ``x_dtype`` makes a new array anyway (one pass, no extra
copy). Labels are always copied (they are small). Field columns follow the images' rule;
their lengths are always copied.

Fields. A batch that carries fields (``Loader(..., fields=...)`` over a set packed with them)
gives ``x`` as a dict keyed by field name, so a multi-input model takes each entry by its
``keras.Input(name=...)``: the images under the schema's image name, then each field in its
padded form with ``"<name>_lengths"`` beside a variable one (``stoker.keras._fields``).

Shutdown. ``close()`` (also ``__exit__``) closes the current pass (the loader's generator
runs its cleanup, in-flight batches are dropped) and then, unless ``close_loader=False``, the
loader itself (workers joined, shared memory unlinked). ``__del__`` only ends the pass: the
loader may be shared with another dataset; a loader nobody references closes itself when
collected, and every loader is closed at exit. An exception from a worker, or a
``KeyboardInterrupt`` while waiting for a batch, propagates out of ``fit`` unchanged; the
dead pass is dropped and the next request (if any) starts a new one. Stopping ``fit`` early
(``model.stop_training``) leaves the pass half read: a later ``fit`` goes on from there,
``close()`` ends it.
"""

from __future__ import annotations

import math
import numbers
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from stoker._core.errors import LoaderError

try:
    import keras
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
    if exc.name == "keras":
        raise ModuleNotFoundError(
            "stoker.keras needs Keras 3: pip install 'stoker[keras]' (or pip install keras)"
        ) from exc
    if exc.name == "tensorflow":
        raise ModuleNotFoundError(
            "Keras 3 defaults to the TensorFlow backend, which is not installed; set "
            "KERAS_BACKEND=torch (or jax) in the environment before importing keras"
        ) from exc
    raise

from stoker.keras._fields import field_arrays, own  # noqa: E402 - after the keras check

__all__ = ["KerasDataset", "dataset"]


class KerasDataset(keras.utils.PyDataset):
    """Hand a stoker loader to Keras 3 ``model.fit`` / ``evaluate`` / ``predict``.

    >>> with stoker.keras.KerasDataset(train_loader, x_dtype="float16") as ds:
    ...     model.fit(ds, validation_data=stoker.keras.KerasDataset(val_loader), epochs=10)

    Args:
        loader: a ``stoker.Loader`` (anything iterable with ``len`` whose items unpack as
            ``images, labels``).
        x_dtype: ``None`` keeps the loader's dtype (uint8 unless the transforms end in
            ``Normalize``); a float dtype (``"float16"``, ``"float32"``) converts, multiplying
            integer images by ``scale``.
        scale: factor for integer images converted to ``x_dtype`` (default 1/255: 0..1).
        steps: batches per Keras epoch; default ``len(loader)``. Batches flow on across loader
            epochs, so ``steps`` may be larger or smaller than one pass. Use this rather than
            ``fit(steps_per_epoch=...)``.
        close_loader: whether ``close()`` also closes the loader (default True).
        inputs: the entries of ``x`` by field name. Default: the image alone (an array) for
            batches without fields; for batches with fields a dict of the image (under the
            schema's image name) and every carried field, each variable one (ragged, text,
            bytes) padded to the set's ``max_len`` with ``"<name>_lengths"`` (int32) beside it.
        targets: the entries of ``y`` by field name (a dict, laid out as ``inputs``); default
            the labels array.

    Images with no channel axis (``(B, H, W)``, e.g. grayscale arrays) get one, as Keras
    expects NHWC (NCHW under ``image_data_format() == "channels_first"``).
    """

    _loader: Any
    _per_pass: int
    _steps: int
    _x_dtype: np.dtype | None
    _scale: float
    _close_loader: bool
    _copy: bool
    _channel_axis: int
    _it: Iterator[Any] | None
    _served: int
    _epochs_ended: int
    _inputs: tuple[str, ...] | None
    _targets: tuple[str, ...] | None
    _last: tuple[Any, Any] | None
    _ahead: deque[tuple[Any, Any]]
    _in_epoch: bool
    _lock: threading.RLock
    _table: np.ndarray | None
    _closed: bool

    def __init__(
        self,
        loader: Any,
        *,
        x_dtype: Any = None,
        scale: float = 1 / 255,
        steps: int | None = None,
        close_loader: bool = True,
        inputs: Sequence[str] | None = None,
        targets: Sequence[str] | None = None,
    ) -> None:
        super().__init__(workers=1, use_multiprocessing=False, max_queue_size=1)
        if not (hasattr(loader, "__iter__") and hasattr(loader, "__len__")):
            raise TypeError(
                "KerasDataset needs a stoker.Loader (an iterable with len), "
                f"got {type(loader).__name__}"
            )
        n = len(loader)
        if n <= 0:
            raise ValueError(
                "the loader yields no batches per epoch (len(loader) == 0): fewer samples than "
                "batch_size with drop_last=True, or an empty source"
            )
        if x_dtype is not None:
            x_dtype = np.dtype(x_dtype)
            if x_dtype.kind != "f":
                raise ValueError(
                    f"x_dtype must be a float dtype such as 'float16' or 'float32' (or None to "
                    f"keep the loader's dtype), got {x_dtype.name!r}"
                )
        if not isinstance(scale, numbers.Real) or not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"scale must be a finite number > 0, got {scale!r}")
        if steps is not None and (
            isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps <= 0
        ):
            raise ValueError(f"steps must be a positive int or None, got {steps!r}")
        for what, names in (("inputs", inputs), ("targets", targets)):
            if names is not None and (
                isinstance(names, str) or not names or not all(isinstance(v, str) for v in names)
            ):
                raise TypeError(f"{what} must be a non-empty list of field names, got {names!r}")
        self._inputs = tuple(inputs) if inputs is not None else None
        self._targets = tuple(targets) if targets is not None else None
        self._loader = loader
        self._per_pass = n
        self._steps = int(steps) if steps is not None else n
        self._x_dtype = x_dtype
        self._scale = float(scale)
        self._close_loader = bool(close_loader)
        self._copy = keras.backend.backend() != "torch"
        self._channel_axis = -1 if keras.config.image_data_format() == "channels_last" else 1
        self._it = None  # the current pass over the loader
        self._served = 0  # batches served in the current Keras epoch
        self._epochs_ended = 0  # Keras epochs that ended having served at least one batch
        self._last = None  # the batch served last (for the build-peek replay)
        self._ahead = deque()  # owned batches the next requests serve first (look-ahead, replay)
        self._in_epoch = False  # between on_epoch_begin and on_epoch_end
        self._lock = threading.RLock()  # tf.data calls __getitem__ from its own threads
        self._table = None  # uint8 -> x_dtype lookup table
        self._closed = False

    # -- Keras never gets to start its own pool -------------------------------------------
    @property
    def workers(self) -> int:
        return 1

    @workers.setter
    def workers(self, value: int) -> None:
        if value != 1:
            raise ValueError(
                "KerasDataset runs with Keras workers=1: the parallel work happens in the "
                "loader's worker processes; set workers= on the stoker.Loader instead"
            )

    @property
    def use_multiprocessing(self) -> bool:
        return False

    @use_multiprocessing.setter
    def use_multiprocessing(self, value: bool) -> None:
        if value:
            raise ValueError(
                "KerasDataset runs with use_multiprocessing=False: the loader already uses "
                "worker processes; Keras forking on top of them is what freezes fit"
            )

    @property
    def max_queue_size(self) -> int:
        return 1

    @max_queue_size.setter
    def max_queue_size(self, value: int) -> None:
        pass  # unused without a Keras pool; the loader's prefetch= sets the depth

    # -- PyDataset ----------------------------------------------------------------------
    @property
    def loader(self) -> Any:
        return self._loader

    def __len__(self) -> int:
        return self._steps

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        if isinstance(index, bool) or not isinstance(index, numbers.Integral):
            raise TypeError(f"batch index must be an int, got {type(index).__name__}")
        if not 0 <= index < self._steps:
            raise IndexError(f"batch index {index} out of range for {self._steps} batches")
        with self._lock:
            if self._closed:
                raise ValueError("this KerasDataset is closed")
            if not self._in_epoch:
                # A look-ahead (TensorFlow's signature pull): the index-th batch of the next
                # epoch, kept for it.
                while len(self._ahead) <= index:
                    batch = self._convert(self._next_batch())
                    self._ahead.append((own(batch[0]), own(batch[1])))
                return self._ahead[index]
            out = self._ahead.popleft() if self._ahead else self._convert(self._next_batch())
            self._last = out
            self._served += 1
            return out

    def on_epoch_begin(self) -> None:
        with self._lock:
            self._served = 0
            self._in_epoch = True

    def on_epoch_end(self) -> None:
        with self._lock:
            self._in_epoch = False
            if self._closed:
                return
            if self._served == 1 and self._epochs_ended == 0 and self._steps > 1:
                # Keras pulled one batch to build the model, then ended the "epoch": serve
                # that batch again as the first one of the real first epoch. (With one batch
                # per epoch a peek looks like a whole epoch: nothing is replayed then.)
                if self._last is not None:
                    self._ahead.appendleft((own(self._last[0]), own(self._last[1])))
            elif self._served:
                self._epochs_ended += 1
            self._served = 0
            self._last = None

    # -- lifecycle ----------------------------------------------------------------------
    def close(self) -> None:
        """End the current pass and (unless ``close_loader=False``) close the loader."""
        with self._lock:  # waits for a request in flight in a tf.data thread
            if self._closed:
                return
            self._closed = True
            self._last = None
            self._ahead.clear()
            try:
                self._drop_pass()
            finally:
                if self._close_loader:
                    self._loader.close()

    def __enter__(self) -> KerasDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # End the pass only: the loader may be shared (a second KerasDataset for evaluate);
        # an unreferenced loader closes itself when collected, and at exit.
        try:
            self._drop_pass()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass

    def __repr__(self) -> str:
        dtype = self._x_dtype.name if self._x_dtype is not None else "as loaded"
        return f"KerasDataset(batches={self._steps}, per_pass={self._per_pass}, x_dtype={dtype})"

    # -- internals ----------------------------------------------------------------------
    def _next_batch(self) -> Any:
        for _ in range(2):
            if self._it is None:
                self._it = iter(self._loader)
            try:
                batch = next(self._it)
            except StopIteration:
                self._it = None  # pass over: the loader advanced its epoch; start the next
                continue
            except BaseException:
                self._drop_pass()  # a worker error or Ctrl-C: this pass is dead
                raise
            return batch
        raise LoaderError("the loader started a new epoch and yielded no batch from it")

    def _drop_pass(self) -> None:
        it, self._it = self._it, None
        close = getattr(it, "close", None)
        if close is not None:
            close()

    def _lut(self, dtype: np.dtype) -> np.ndarray:
        if self._table is None:
            vals = np.arange(256, dtype=np.float32) * np.float32(self._scale)
            self._table = vals.astype(dtype)
        return self._table

    def _convert(self, batch: Any) -> tuple[Any, Any]:
        try:
            images, labels = batch
        except (TypeError, ValueError):
            raise TypeError(
                f"the loader's batches must unpack as (images, labels), got {type(batch).__name__}"
            ) from None
        x = np.asarray(images)
        if x.ndim == 3:  # (B, H, W): add the channel axis Keras expects
            x = np.expand_dims(x, self._channel_axis)
        if self._x_dtype is not None and x.dtype != self._x_dtype:
            out = np.empty(x.shape, self._x_dtype)
            if x.dtype == np.uint8 and self._x_dtype.itemsize < 4:
                np.take(
                    self._lut(out.dtype), x, out=out
                )  # float16: a table beats float16 arithmetic
            elif x.dtype.kind in "ui":
                loop = np.float64 if self._x_dtype.itemsize > 4 else np.float32
                np.multiply(x, loop(self._scale), out=out, dtype=loop, casting="unsafe")
            else:
                out[...] = x
            x = out
        elif self._copy:
            x = np.array(x)
        names = self._inputs
        if names is None and getattr(batch, "fields", None):
            names = (batch.schema.image_name, *batch.fields)
        y: Any = np.array(labels)
        if self._targets is not None:
            y = field_arrays(batch, self._targets, x, copy=True)
        if names is None:
            return x, y
        return field_arrays(batch, names, x, copy=self._copy), y


def dataset(
    source: Any,
    *,
    batch_size: int,
    x_dtype: Any = None,
    scale: float = 1 / 255,
    steps: int | None = None,
    inputs: Sequence[str] | None = None,
    targets: Sequence[str] | None = None,
    **loader_options: Any,
) -> KerasDataset:
    """Build a ``stoker.Loader`` over ``source`` and wrap it in a :class:`KerasDataset`.

    ``loader_options`` go to the loader (``transforms=``, ``pair_with=``, ``shuffle=``,
    ``seed=``, ``workers=``, ``fields=``, ...). The dataset owns the loader: ``close()`` closes
    both.

    >>> ds = stoker.keras.dataset((x, y), batch_size=256, pair_with=kanji_distort(64),
    ...                           shuffle=True, seed=0, workers=4, x_dtype="float16")
    """
    from stoker.loader import Loader

    loader = Loader(source, batch_size=batch_size, **loader_options)
    try:
        return KerasDataset(
            loader,
            x_dtype=x_dtype,
            scale=scale,
            steps=steps,
            close_loader=True,
            inputs=inputs,
            targets=targets,
        )
    except BaseException:
        loader.close()
        raise
