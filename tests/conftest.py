"""Suite-wide settings. Its folder (``tests/``) is on ``sys.path`` for every test, so the shared helpers
(``cli_runner``, ``vision_files``, ...) import by name from any subfolder."""
