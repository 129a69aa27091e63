// The reference for lite_push's key router: Java's own String.hashCode and
// Math.floorMod, printed for keys read from stdin.
//
//   javac -d /tmp/jh tests/java/JavaHash.java
//   printf 'aABlAGwAbABvAA==\n' | java -cp /tmp/jh JavaHash
//
// Input: one key per line, as base64 of the key's UTF-16LE code units, so
// that any Java String survives the trip (newlines, NUL, lone surrogates).
// An empty line is the empty key.
//
// Output: a header line "moduli <n1> <n2> ...", then one line per input key:
// "<hashCode> <floorMod(hashCode, n1)> <floorMod(hashCode, n2)> ...".
// tests/java/regen_java_hashes.py and tests/test_java_parity.py drive it.

import java.io.BufferedReader;
import java.io.BufferedWriter;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.nio.charset.StandardCharsets;
import java.util.Base64;

public final class JavaHash {
    static final int[] MODULI = {1, 2, 3, 7, 8, 16, 64, 1000, 1024};

    public static void main(String[] args) throws IOException {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.US_ASCII));
        BufferedWriter out = new BufferedWriter(new OutputStreamWriter(System.out, StandardCharsets.US_ASCII));
        StringBuilder header = new StringBuilder("moduli");
        for (int n : MODULI) {
            header.append(' ').append(n);
        }
        out.write(header.toString());
        out.newLine();
        String line;
        while ((line = in.readLine()) != null) {
            byte[] bytes = Base64.getDecoder().decode(line.strip());
            if (bytes.length % 2 != 0) {
                throw new IllegalArgumentException("odd number of UTF-16LE bytes: " + line);
            }
            // Code units straight into a char[]: no charset decoder, so a lone
            // surrogate stays what it is instead of becoming U+FFFD.
            char[] units = new char[bytes.length / 2];
            for (int i = 0; i < units.length; i++) {
                units[i] = (char) ((bytes[2 * i] & 0xFF) | ((bytes[2 * i + 1] & 0xFF) << 8));
            }
            int h = new String(units).hashCode();
            StringBuilder row = new StringBuilder().append(h);
            for (int n : MODULI) {
                row.append(' ').append(Math.floorMod(h, n));
            }
            out.write(row.toString());
            out.newLine();
        }
        out.flush();
    }
}
