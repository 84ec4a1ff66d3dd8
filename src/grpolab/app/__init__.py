"""Layer 7, what a user runs: the command line, the Python API, chat, audit, export, the HTML report,
the lab (the lesson's claims as commands) and the bench against TRL.
"""
