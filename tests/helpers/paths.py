"""Where the tests find the repository: its root, and the example jobs and AdmissionReviews."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
