"""Example Volcano jobs and AdmissionReviews, shipped with the package.

``serve`` with no ``--jobs-dir`` serves ``jobs/`` from here, so an installed package answers the
README's examples from any directory.
"""
