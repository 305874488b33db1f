"""The deterministic core: the replicated state and the rules every replica applies to it.

It is also built compiled (mypyc; README, "A compiled core"), which asks two things of its source:
a class's constants are `Final` (the compiled code reads a class attribute through the class only
then), and its annotations hold (a compiled function checks them as it runs)."""

# Whether the core runs compiled (its modules built with mypyc: RUNSTATE_COMPILE=1 at install;
# README, "A compiled core"): a compiled module's file is a C extension, not Python source.
COMPILED: bool = not __file__.endswith((".py", ".pyc"))
