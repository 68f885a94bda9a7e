"""Schema-driven fuzzing of the HTTP API: schemathesis reads the app's OpenAPI document and sends
generated requests (valid AdmissionReviews and broken ones) to every operation. No answer is 5xx."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, settings

from tests.helpers.paths import EXAMPLES
from volcano_job_webhook.plugins import Chain
from volcano_job_webhook.server.app import create_app
from volcano_job_webhook.server.jobs import DirectoryJobSource

app = create_app(DirectoryJobSource(EXAMPLES / "jobs"), Chain())
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case):
    response = case.call()
    assert response.status_code < 500, response.text
    if case.method == "POST" and case.path in ("/mutate", "/validate"):
        assert response.status_code in (200, 400, 413, 422), response.status_code
