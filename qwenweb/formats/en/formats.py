"""English formats: every time to the second in one format, ``2026-12-02 14:03:09``.

Django's own English formats show ``Dec. 2, 2026, 2:03 p.m.`` in one place and
``2026-12-02 14:03`` in another; operators compare times with log lines and records, to
the second (times are UTC: ``TIME_ZONE``).
"""

DATETIME_FORMAT = "Y-m-d H:i:s"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s"
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
TIME_FORMAT = "H:i:s"
