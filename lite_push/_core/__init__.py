"""What both consumer facades share: the core that checks, builds
(:mod:`.wiring`), starts and stops (:mod:`.shutdown`) one consumer
(:mod:`.consumer_core`); the listener it is given (:mod:`.listeners`;
its spans: :mod:`lite_push._tracing`); what it reports (:mod:`.snapshots`); and
SIGINT/SIGTERM as a request to stop (:mod:`.signals`).
"""
