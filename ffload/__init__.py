"""ffload: convert image datasets once into memory-mapped files, then load them with compiled pipelines."""
__version__ = "0.1.0"
from ffload.loaders import Loader, OrderOption  # noqa: E402
