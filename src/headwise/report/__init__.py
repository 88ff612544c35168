"""Self-contained HTML reports: inline SVG figures (:mod:`.svg`), a page builder (:mod:`.builder`) and the
standard per-head analysis report (:mod:`.analysis`).

>>> from headwise.report import write_report
>>> write_report(json.load(open("stats.json")), "out/")   # -> Path("out/report.html")
"""

from . import svg
from .analysis import analysis_report, check_stats, write_report
from .builder import REPORT_FILE, Report, Section

__all__ = ["svg", "analysis_report", "check_stats", "write_report", "Report", "Section", "REPORT_FILE"]
