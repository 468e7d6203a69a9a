"""Plain config values: the types of init arguments that a config fills with data, never with objects.

jsonargparse builds an object from a ``{class_path: ..., init_args: ...}`` mapping wherever an argument's type
allows one (``Any``, ``Dict[str, Any]``), so a config typed that way could construct any importable class (e.g.
``subprocess.Popen``). An argument typed with these unions takes the parsed YAML/JSON as it is: a mapping with a
``class_path`` stays a plain ``dict``, at any depth. Use them for every free-form option of a LightningModule,
DataModule or callback (``model_kwargs``, ``method_options``, ``masking_options``, ...); where a config
legitimately chooses a class, the argument is a typed class slot (``trainer.callbacks``, ``data``), not these.
"""
from typing import Dict, Union

#: one config value: a scalar, or a list or mapping of plain values (kept as parsed, never instantiated)
PlainValue = Union[None, bool, int, float, str, list, dict]
#: keyword options given in a config
PlainDict = Dict[str, PlainValue]
