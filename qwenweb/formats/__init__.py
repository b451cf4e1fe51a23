"""Date and number formats of the pages and the admin (``FORMAT_MODULE_PATH``)."""
