"""The scenes, one per module: each has a ``TITLE`` and ``play(stage)``, with its narration beside its checks.

A scene narrates each command, runs it for real, waits for the state it describes and checks the
outcome it told, so a demo that finishes told the truth. Scenes run in the order runner.py lists
them; the broken-GPU scene leaves its device on the stage for the recovery scene.
"""
