"""The peers ``ffload bench`` measures ffload's ``Loader`` against: every loader kind of
:data:`ffload.bench.config.KINDS` but ``ffload``. The measurement subprocess loads this folder
by path without importing ``ffload`` (see :mod:`ffload.bench.worker`), so its modules use
relative imports and import ``ffload`` only inside functions; this file imports nothing.

Modules: ``baselines`` (ffcv's ``Loader``, ``DataLoader`` over in-memory arrays, ``DataLoader`` +
PIL and ``DataLoader`` + OpenCV + Albumentations over the ImageFolder), ``ceiling`` (the measured
JPEG decode ceiling and its decoders).
"""
