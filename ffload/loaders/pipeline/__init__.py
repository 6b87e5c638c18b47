"""Field pipelines: the :class:`~.operation.Operation` protocol with its ``Spec`` and ``BatchContext`` (:mod:`.operation`), building and running one pipeline per field (:mod:`.build`), and the crop geometry decoders share with later stages (:mod:`.geometry`)."""

from __future__ import annotations
