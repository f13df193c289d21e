"""The sandboxed Jinja environment chat templates render in, with its hot attribute lookups made direct.

transformers renders chat templates in jinja2's ``ImmutableSandboxedEnvironment``.
There ``message.role`` on a message dict first tries ``getattr(dict, "role")``,
fails with an ``AttributeError``, then falls back to ``message["role"]``, and a
found attribute is checked three ways (``str.format``, private or internal
names, methods that mutate) before it is returned: a third of a render's time.
:class:`FastSandbox` answers the lookups whose result those rules fix in
advance directly, and sends every other one to the sandbox's own code:

* a key of a plain ``dict`` (``type(obj) is dict``) named like no attribute of
  ``dict`` (``dir(dict)``): the sandbox's ``getattr`` fails on such a name and
  returns ``obj[name]``, or undefined if there is no such key;
* a counter of a ``{% for %}`` loop (``loop.index0``, ``loop.last``...: ints and
  bools, none of them private, internal, a method or mutable);
* a method of a plain ``str`` other than ``format`` / ``format_map`` (which the
  sandbox wraps) and the ``_`` names (which it refuses);
* a call of one of the environment's own extension methods (``direct_calls``);
* a template's globals as one dict (the environment's, then the template's own)
  rather than jinja2's ``ChainMap`` of the two, which every render copies key by
  key (7 of a small render's 12 µs): the same names and values, as long as the
  environment's globals are not changed after a template is made (jinja2 asks
  the same; :func:`vecpack.chat.template.compile_jinja` sets them first).

So every template renders the same text, and raises the same errors, as in
``ImmutableSandboxedEnvironment`` (tests/test_sandbox.py renders hostile
templates in both).

>>> env = FastSandbox()
>>> env.from_string("{{ m.role }} {{ m.get('role') }} {{ m.nope is defined }}").render(m={"role": "user"})
'user user False'
"""

from __future__ import annotations

from types import MethodType

from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["FastSandbox"]

_DICT_ATTRS = frozenset(dir(dict))  # every name getattr finds on a plain dict (it has no instance __dict__)
_LOOP_ATTRS = frozenset({"index0", "index", "revindex0", "revindex", "first", "last", "length", "depth",
                         "depth0"})  # properties and ints of LoopContext: plain values
_STR_METHODS = frozenset(n for n in dir(str) if not n.startswith("_") and n not in ("format", "format_map"))
_getattr = getattr


class FastSandbox(ImmutableSandboxedEnvironment):
    """``ImmutableSandboxedEnvironment`` whose ``getattr`` takes a direct path where the sandbox's answer is
    known in advance (see the module's docstring); every other lookup is the sandbox's.

    ``direct_calls``: functions of the caller's own (an extension's methods) whose bound methods the
    template calls directly, as ``Context.call`` calls them (none of them takes the context).
    """

    direct_calls: frozenset = frozenset()

    def getattr(self, obj, attribute):
        if type(attribute) is str:
            t = type(obj)
            if t is dict:
                if attribute not in _DICT_ATTRS:
                    try:
                        return obj[attribute]
                    except KeyError:
                        return self.undefined(obj=obj, name=attribute)
            elif t is LoopContext:
                if attribute in _LOOP_ATTRS:
                    try:
                        return _getattr(obj, attribute)
                    except AttributeError:
                        pass
            elif t is str and attribute in _STR_METHODS:
                return _getattr(obj, attribute)
        return ImmutableSandboxedEnvironment.getattr(self, obj, attribute)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja2's names (never a keyword's)
        if type(__obj) is MethodType and __obj.__func__ in __self.direct_calls:
            kwargs.pop("_block_vars", None)
            kwargs.pop("_loop_vars", None)
            try:
                return __obj(*args, **kwargs)
            except StopIteration:  # as Context.call answers it
                return __context.environment.undefined("value was undefined because a callable raised a "
                                                       "StopIteration exception")
        return ImmutableSandboxedEnvironment.call(__self, __context, __obj, *args, **kwargs)

    def make_globals(self, d):
        return {**self.globals, **(d or {})}
