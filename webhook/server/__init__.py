"""The admission webhook (``volcano-webhook serve``): :mod:`.admission` parses an AdmissionReview, a
:mod:`.handlers` handler looks its job up (:mod:`.jobs`), runs the chain and diffs the Pod
(:mod:`.patch`), :mod:`.app` serves it and :mod:`.https` runs the HTTPS server. Nothing is imported
here, so that the offline commands, which use only .patch and .admission, load no FastAPI or uvicorn."""
