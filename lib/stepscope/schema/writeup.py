"""`06_writeup/`: the report's file names."""

from __future__ import annotations

REPORT_MD, REPORT_HTML = "report.md", "report.html"
APPENDIX_MD, APPENDIX_HTML = "appendix.md", "appendix.html"
"""The report and its appendix, side by side in 06_writeup/ and linked to each other: the markdown
pair by their .md names, the HTML pair by their .html names."""
