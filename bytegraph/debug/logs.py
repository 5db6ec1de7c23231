"""Logging under the ``bytegraph.*`` logger names, switched on by topic.

``BYTEGRAPH_LOGS=graph,guards,recompiles`` (read by config) or
``bytegraph.config.log_topics = [...]`` turns topics on. A topic that is on
gets its logger set to DEBUG with a stderr handler; nothing is printed to
stdout, and nothing at all unless asked.
"""
import logging
import sys

from ..config import LOG_TOPICS, config, watch

_handler = None


def get_logger(topic):
    return logging.getLogger(f"bytegraph.{topic}")


def enabled(topic):
    return get_logger(topic).isEnabledFor(logging.DEBUG)


def apply_topics(topics):
    global _handler
    if _handler is None:
        _handler = logging.StreamHandler(sys.stderr)
        _handler.setFormatter(logging.Formatter("[bytegraph.%(topic)s] %(message)s"))
        _handler.addFilter(_TopicFilter())
    for topic in LOG_TOPICS:
        logger = get_logger(topic)
        if topic in topics:
            logger.setLevel(logging.DEBUG)
            if _handler not in logger.handlers:
                logger.addHandler(_handler)
        else:
            if _handler in logger.handlers:
                logger.removeHandler(_handler)
            logger.setLevel(logging.NOTSET)


class _TopicFilter(logging.Filter):
    def filter(self, record):
        record.topic = record.name.rsplit(".", 1)[-1]
        return True


watch("log_topics", apply_topics)
if config.log_topics:   # BYTEGRAPH_LOGS, read by config at import
    apply_topics(config.log_topics)
