package io.fifolane.bench;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;
import org.apache.avro.Schema;
import org.apache.avro.SchemaNormalization;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.DecoderFactory;

/**
 * The writer schemas of fifolane's entity types (schemas/*.avsc and schemas/history), by
 * CRC-64-AVRO fingerprint, and the decoding of an Avro single-object encoded value
 * (0xC3 0x01, the fingerprint little-endian, the Avro binary body) into the entity's type,
 * key and version: the fields the schema marks with fifolane.type / fifolane.key /
 * fifolane.version, or the fields of the system schema fifolane.Delete.
 */
final class Catalog {
    /** One decoded input value: the entity key ({@code type/key}), its version, a delete or not. */
    record Entity(String key, long version, boolean delete) {}

    private record Writer(GenericDatumReader<GenericRecord> reader, String type, String keyField,
                          String versionField, boolean delete) {}

    private final Map<Long, Writer> writers = new HashMap<>();
    private BinaryDecoder decoder;
    private GenericRecord reuse;

    static Catalog load(Path dir) throws IOException {
        List<Path> files = new ArrayList<>();
        for (Path d : List.of(dir, dir.resolve("history"))) {
            if (Files.isDirectory(d)) {
                try (Stream<Path> s = Files.list(d)) {
                    s.filter(p -> p.toString().endsWith(".avsc")).sorted().forEach(files::add);
                }
            }
        }
        Catalog catalog = new Catalog();
        for (Path file : files) {
            Schema schema = new Schema.Parser().parse(file.toFile());  // one parser per file: versions share names
            catalog.add(schema);
        }
        if (catalog.writers.isEmpty()) {
            throw new IllegalArgumentException("no .avsc schemas in " + dir);
        }
        return catalog;
    }

    private void add(Schema schema) {
        long fp = SchemaNormalization.parsingFingerprint64(schema);
        if ("fifolane.Delete".equals(schema.getFullName())) {
            writers.put(fp, new Writer(new GenericDatumReader<>(schema), null, "key", "version", true));
            return;
        }
        String type = schema.getProp("fifolane.type");
        String key = null;
        String version = null;
        for (Schema.Field f : schema.getFields()) {
            if ("true".equals(String.valueOf(f.getObjectProp("fifolane.key")))) {
                key = f.name();
            }
            if ("true".equals(String.valueOf(f.getObjectProp("fifolane.version")))) {
                version = f.name();
            }
        }
        if (type != null && key != null && version != null) {
            writers.put(fp, new Writer(new GenericDatumReader<>(schema), type, key, version, false));
        }
    }

    /** The entity of one single-object encoded value; IllegalArgumentException if it is not one. */
    Entity decode(byte[] value) {
        if (value == null || value.length < 10 || value[0] != (byte) 0xC3 || value[1] != 0x01) {
            throw new IllegalArgumentException("not an Avro single-object encoded value");
        }
        long fp = ByteBuffer.wrap(value, 2, 8).order(ByteOrder.LITTLE_ENDIAN).getLong();
        Writer w = writers.get(fp);
        if (w == null) {
            throw new IllegalArgumentException(String.format("unknown schema fingerprint %016x", fp));
        }
        decoder = DecoderFactory.get().binaryDecoder(value, 10, value.length - 10, decoder);
        try {
            reuse = w.reader().read(reuse != null && reuse.getSchema() == w.reader().getSchema() ? reuse : null,
                                    decoder);
        } catch (IOException e) {
            throw new IllegalArgumentException("undecodable Avro body: " + e.getMessage(), e);
        }
        String type = w.delete() ? reuse.get("entity_type").toString() : w.type();
        long version = ((Number) reuse.get(w.versionField())).longValue();
        return new Entity(type + "/" + reuse.get(w.keyField()), version, w.delete());
    }
}
