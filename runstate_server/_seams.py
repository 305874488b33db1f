"""The seams where runstate reaches into a dependency's internals, checked when they are imported.

runstate extends two libraries from the inside: pysyncobj (its Raft engine: cluster/_pysyncobj.py)
and aiohttp (its HTTP server: node/_aiohttp.py). Each has one module that imports everything of
the library that the rest of the project touches beyond its public API, declares each such name
as a `Seam`, and calls `check` at import. A release that renamed or removed one of them would not
fail loudly by itself: an override by a name-mangled name (`_SyncObj__onMessageReceived`) that the
library no longer calls is simply never called, and pre-vote, the read index's routing or a safety
fix would switch off without a word. So `check` refuses, with `DependencyMismatch`, a release that
was not tested (unless ALLOW_UNTESTED_ENV is 1: then it only warns) and, whatever the release:

- `Method`: the class (or a base) has this method;
- `Override`: that, and the library's own code still calls it by that name (the name is read in
  some other function of the library's modules imported so far), so our override of it is the one
  that runs;
- `Attribute`: the library's own code of the class stores an attribute of that name (an instance
  attribute: set in `__init__` or elsewhere), or the class has it;
- `Constant`: the module has this name;
- `Signature`: the library itself (not a base of another library's, such as asyncio's no-op
  Protocol callbacks) defines the method, with these parameters;
- `CalledBy`: a method of the library still calls this name (our override of it, on another
  class, is the one that runs).

The checks read the library's compiled code with `dis` (the standard library's, public), and
never call it. `runstate_server.node.cli` turns a DependencyMismatch into a refusal to start that
names the library, its version and the missing name.
"""

from __future__ import annotations

import dis
import functools
import importlib.metadata
import inspect
import logging
import os
import sys
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# Set to 1 to start a node on a release of pysyncobj or aiohttp that was not tested (it warns, and
# every seam is still checked): compat/newest/run.sh --unbounded does.
ALLOW_UNTESTED_ENV = "RUNSTATE_ALLOW_UNTESTED_DEPENDENCIES"
# Code objects whose names are kept: every function of the two libraries' classes has one (a few
# thousand at most).
CODE_OBJECTS_CACHED_MAX = 8192
LOCK_HINT = 'install the releases of the lock (README, "Dependencies and the lock")'


class DependencyMismatch(RuntimeError):
    """A dependency's installed release is not one runstate was tested with, or lacks a name
    runstate reaches for: the node must not start."""


@dataclass(frozen=True)
class Seam:
    owner: type | types.ModuleType
    name: str
    used_by: str  # the project's module that touches it, for the message and the docs

    kind = "name"

    @property
    def owner_name(self) -> str:
        return self.owner.__name__ if isinstance(self.owner, types.ModuleType) else self.owner.__qualname__

    def problem(self, package: str) -> str | None:
        raise NotImplementedError


@dataclass(frozen=True)
class Method(Seam):
    kind = "method"

    def problem(self, package: str) -> str | None:
        if not callable(inspect.getattr_static(self.owner, self.name, None)) and not callable(getattr(self.owner, self.name, None)):
            return f"{self.owner_name} has no method {self.name}"
        return None


@dataclass(frozen=True)
class Override(Method):
    kind = "override"

    def problem(self, package: str) -> str | None:
        missing = super().problem(package)
        if missing is not None:
            return missing
        assert isinstance(self.owner, type)
        own = {id(code) for _, code in function_codes(inspect.getattr_static(self.owner, self.name, None))}
        if not _readers(package, _loaded_modules(package)).get(self.name, frozenset()) - own:
            return f"{self.owner_name}.{self.name} is no longer called by {package}'s own code"
        return None


@dataclass(frozen=True)
class Attribute(Seam):
    kind = "attribute"

    def problem(self, package: str) -> str | None:
        assert isinstance(self.owner, type)
        if hasattr(self.owner, self.name) or stores_attribute(self.owner, package, self.name):
            return None
        return f"{self.owner_name} has no attribute {self.name}"


@dataclass(frozen=True)
class Constant(Seam):
    kind = "constant"

    def problem(self, package: str) -> str | None:
        if not hasattr(self.owner, self.name):
            return f"{self.owner_name} has no {self.name}"
        return None


@dataclass(frozen=True)
class Signature(Seam):
    """The library itself defines the method (not only a base of another library, e.g. asyncio's
    no-op Protocol callbacks) with these parameters: all of them, in this order, when `exact`
    (our override takes what aiohttp passes positionally), else at least these (keywords we pass)."""

    parameters: tuple[str, ...] = ()
    exact: bool = True
    called: bool = False  # and, as an Override, the library's own code calls it by this name

    kind = "signature"

    def problem(self, package: str) -> str | None:
        if self.called and (not_called := Override(self.owner, self.name, self.used_by).problem(package)) is not None:
            return not_called
        function = inspect.getattr_static(self.owner, self.name, None)
        if not callable(function):
            return f"{self.owner_name} has no method {self.name}"
        module = getattr(function, "__module__", None) or ""
        if module.split(".")[0] != package:
            return f"{self.owner_name}.{self.name} is no longer {package}'s own (it is {module}'s)"
        names = tuple(name for name in inspect.signature(function).parameters if name != "self")
        if self.exact and names != self.parameters:
            return f"{self.owner_name}.{self.name} takes ({', '.join(names)}), not ({', '.join(self.parameters)})"
        missing = [name for name in self.parameters if name not in names]
        if missing:
            return f"{self.owner_name}.{self.name} takes no {', '.join(missing)}"
        return None


@dataclass(frozen=True)
class CalledBy(Seam):
    """The library's method `owner.name` still calls `called` (it reads the name): our override
    of `called`, on another class, is the one that runs."""

    called: str = ""

    kind = "called by"

    def problem(self, package: str) -> str | None:
        function = inspect.getattr_static(self.owner, self.name, None)
        if not callable(function):
            return f"{self.owner_name} has no method {self.name}"
        if not any(self.called in names_read(code) for _, code in function_codes(function)):
            return f"{self.owner_name}.{self.name} no longer calls {self.called}"
        return None


def installed_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def check(
    distribution: str, package: str, tested: Callable[[str], bool], tested_text: str, seams: Sequence[Seam]
) -> None:
    """DependencyMismatch when the release of `distribution` installed is untested (unless
    ALLOW_UNTESTED_ENV) or misses any of `seams`; `package` is its top-level import name."""
    _readers.cache_clear()  # the library as it is now (a test may have changed it since)
    version = installed_version(distribution)
    if not tested(version):
        message = f"{distribution} {version} is installed; runstate was tested with {distribution} {tested_text}"
        if os.environ.get(ALLOW_UNTESTED_ENV) != "1":
            raise DependencyMismatch(f"{message}: {LOCK_HINT}, or set {ALLOW_UNTESTED_ENV}=1 to try it")
        log.warning("%s (%s=1: starting anyway)", message, ALLOW_UNTESTED_ENV)
    problems = [(seam, problem) for seam in seams if (problem := seam.problem(package)) is not None]
    if problems:
        lines = "; ".join(f"{problem} (used by {seam.used_by})" for seam, problem in problems)
        raise DependencyMismatch(
            f"{distribution} {version} lacks what runstate reaches for: {lines}. runstate was tested with "
            f"{distribution} {tested_text}: {LOCK_HINT}"
        )


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _code_objects(constant)


def function_codes(value: Any) -> Iterator[tuple[str, types.CodeType]]:
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, property):
        for accessor in (value.fget, value.fset, value.fdel):
            if accessor is not None:
                yield from function_codes(accessor)
        return
    code = getattr(value, "__code__", None)
    if isinstance(code, types.CodeType):
        yield code.co_name, code


def _library_classes(owner: type, package: str) -> Iterable[type]:
    return [klass for klass in owner.__mro__ if klass.__module__.split(".")[0] == package]


def _loaded_modules(package: str) -> tuple[str, ...]:
    """The library's modules imported so far, by name."""
    return tuple(sorted(
        name for name, module in list(sys.modules.items())
        if module is not None and (name == package or name.startswith(package + "."))
    ))


# Packages whose index of readers is kept, within one `check` (which starts it afresh).
PACKAGE_INDEXES_CACHED_MAX = 2


@functools.lru_cache(maxsize=PACKAGE_INDEXES_CACHED_MAX)
def _readers(package: str, modules: tuple[str, ...]) -> dict[str, frozenset[int]]:
    """Each name the library's code reads (every function of `modules`: module-level, and the
    methods of the classes they define), with the ids of the code objects that read it. Built once
    for all the Override checks of one `check` (walking every function per seam cost most of the start's check)."""
    readers: dict[str, set[int]] = {}
    for module_name in modules:
        module = sys.modules.get(module_name)
        if module is None:
            continue
        values: list[Any] = []
        for value in vars(module).values():
            if isinstance(value, type) and value.__module__ == module_name:
                values += vars(value).values()
            else:
                values.append(value)
        for value in values:
            for _, code in function_codes(value):
                for name in names_read(code):
                    readers.setdefault(name, set()).add(id(code))
    return {name: frozenset(ids) for name, ids in readers.items()}


@functools.lru_cache(maxsize=CODE_OBJECTS_CACHED_MAX)
def names_read(code: types.CodeType) -> frozenset[str]:
    return frozenset(name for nested in _code_objects(code) for name in nested.co_names)


def stores_attribute(owner: type, package: str, name: str) -> bool:
    """The library's code of `owner` (and its library bases) stores an attribute `name`. Only the
    functions that name it at all are disassembled (most of the check's time at start)."""
    return any(
        name in names_read(code) and name in _stores(code)
        for klass in _library_classes(owner, package)
        for value in vars(klass).values()
        for _, code in function_codes(value)
    )


def attributes_stored(owner: type, package: str) -> frozenset[str]:
    stored: set[str] = set()
    for klass in _library_classes(owner, package):
        for value in vars(klass).values():
            for _, code in function_codes(value):
                stored |= _stores(code)
    return frozenset(stored)


@functools.lru_cache(maxsize=CODE_OBJECTS_CACHED_MAX)
def _stores(code: types.CodeType) -> frozenset[str]:
    return frozenset(
        instruction.argval
        for nested in _code_objects(code)
        for instruction in dis.get_instructions(nested)
        if instruction.opname == "STORE_ATTR"
    )
