"""What happens to a message before it becomes a turn: who may talk (access, pairing), throttles,
attachments, media and voice notes, the thread it was written in, the provenance it carries."""
