"""The primitives: one module or package each, registered in `softdta.core.registry` (see `base.Primitive`)."""

from softdta.core import registry
from softdta.core.primitives.append import Append, AppendRuntime
from softdta.core.primitives.base import (
    BatchPrimitive,
    BatchResult,
    KeyWrites,
    Output,
    PluginReport,
    PluginRows,
    Primitive,
    Target,
    TranslatorContext,
    load,
)
from softdta.core.primitives.flush import FlushRequest
from softdta.core.primitives.key_increment import KeyIncrement
from softdta.core.primitives.key_write import KeyWrite, write_key
from softdta.core.primitives.postcarding import PostcardEntry, Postcarding
from softdta.core.primitives.sketch_merge import SketchMerge, SketchRuntime

BUILT_IN: tuple[type[Primitive], ...] = (KeyWrite, KeyIncrement, Append, Postcarding, SketchMerge)
for _primitive in BUILT_IN:
    registry.register(_primitive)

__all__ = ["Append", "AppendRuntime", "BatchPrimitive", "BatchResult", "BUILT_IN", "FlushRequest", "KeyIncrement",
           "KeyWrite", "KeyWrites", "Output", "PluginReport", "PluginRows", "PostcardEntry", "Postcarding", "Primitive",
           "SketchMerge", "SketchRuntime", "Target", "TranslatorContext", "load", "write_key"]
